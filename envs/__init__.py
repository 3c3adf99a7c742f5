"""Environments: the contract, the sandbox, simulated and device envs. Never imports jax.

    from mpa_jax.envs import make_env, load_tasks, Action
    tasks = load_tasks("test")          # or "train" / "dev" / a JSONL path; cached on disk
    env = make_env("sandbox")
    obs = env.reset(tasks[0]); fb = env.step(Action.tool_call(...)); v = env.verify(); env.close()
"""
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
from mpa_jax.envs.episode import ChatEpisode  # noqa: F401
from mpa_jax.envs.oracle import run_oracle_episode  # noqa: F401
from mpa_jax.envs.render import action_to_message, feedback_to_message, message_to_actions, tool_call_to_action  # noqa: F401
from mpa_jax.envs.sandbox import SandboxEnv, task_tool_specs  # noqa: F401

from mpa_jax.envs.base import ENV_KINDS, Env, env_kwargs, make_env, register_env  # noqa: F401,E402
