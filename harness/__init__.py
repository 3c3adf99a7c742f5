"""Harness: the runtime between planner and environment (DESIGN §5). Never imports jax, flax or torch.

    from mpa_jax.harness import HarnessConfig, HarnessSession
    session = HarnessSession(HarnessConfig.defaults(enabled=True, tools="catalog"))
    env = session.env_factory()          # speaks the env protocol: the agent loop needs no other seam
    obs = env.reset(task); fb = env.step(action); v = env.verify(); env.close()

Modules: `config` (HarnessConfig from `config.harness`), `runtime` (HarnessSession, HarnessEnv:
context, routing, feedback, traces, sub-agents), `registry` (one tool registry over providers:
sandbox, MCP, memory), `mcp` (MCP servers over stdio with the official SDK), `retrieval` (catalog
top-k), `normalise` (schema normalisers + approved rewrites), `skills` (versioned skill files and
macros), `planners` (engine / OpenAI-compatible / scripted backends of the one planner protocol, driven by
`envs.episode`), `store` (SQLite WAL trace + proposal store), `evolution` (mining, review, versions).
Memory (`mpa_jax.harness.memory`) plugs in as a tool provider.
"""
from mpa_jax.harness.config import HARNESS_VERSION, HarnessConfig, HarnessConfigError  # noqa: F401
from mpa_jax.harness.registry import SandboxTools, ToolProvider, ToolRegistry  # noqa: F401
from mpa_jax.harness.evolution import HarnessVersion  # noqa: F401
from mpa_jax.harness.runtime import HarnessEnv, HarnessSession  # noqa: F401
from mpa_jax.harness.store import HarnessStore, HarnessStoreError  # noqa: F401
