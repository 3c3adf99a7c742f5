"""Environments: the contract, the sandbox, simulated and device envs. Never imports jax.

    from mpa_jax.envs import make_env, load_tasks, Action
    tasks = load_tasks("test")          # or "train" / "dev" / a JSONL path; cached on disk
    env = make_env("sandbox")
    obs = env.reset(tasks[0]); fb = env.step(Action.tool_call(...)); v = env.verify(); env.close()
"""
from typing import Any

from mpa_jax.envs.contract import (  # noqa: F401
    CATEGORIES,
    DOMAINS,
    SCHEMA_VERSION,
    SPLITS,
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
    canonical_json,
    read_jsonl,
    write_jsonl,
)
from mpa_jax.envs.benchmark import counts_table, generate_split, load_tasks, tools_used  # noqa: F401
from mpa_jax.envs.oracle import OracleEpisode, run_oracle_episode  # noqa: F401
from mpa_jax.envs.render import action_to_message, feedback_to_message, message_to_actions, tool_call_to_action  # noqa: F401
from mpa_jax.envs.sandbox import SandboxEnv, task_tool_specs  # noqa: F401

ENV_KINDS: dict[str, Any] = {"sandbox": SandboxEnv}


def make_env(kind: str = "sandbox", **kwargs: Any) -> Any:
    """An environment by kind ("sandbox" now; "simulated" and "adb" are registered by later modules)."""
    if kind not in ENV_KINDS:
        raise ValueError(f"unknown env kind {kind!r} (available: {', '.join(sorted(ENV_KINDS))})")
    return ENV_KINDS[kind](**kwargs)


def register_env(kind: str, factory: Any) -> None:
    """Register another env kind (simulated, adb, ...) for make_env."""
    ENV_KINDS[kind] = factory
