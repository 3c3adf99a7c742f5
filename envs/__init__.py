"""Environments: the contract, the sandbox, simulated and device envs. Never imports jax."""
from mpa_jax.envs.contract import (  # noqa: F401
    CATEGORIES,
    DOMAINS,
    Action,
    Check,
    ContractError,
    ErrorCode,
    Feedback,
    Step,
    Task,
    ToolSpec,
    Trajectory,
    Verification,
)
