"""The prompt-injection defense (docs/security.md; no jax).

- `guard.GuardedEnv`: any env behind a defense (on by default: `config.security`); tool results marked as data
  and a CaMeL-style sink policy; AgentDojo's own defenses (spotlight, pi_detector, tool_filter) for comparison.
- `policy`: the sink policies as reviewed, versioned data (`policies/`).
- `provenance`: where values came from, and the instruction-span detector.
- `gullible.GulliblePlanner`: a scripted test double for a weak LLM that obeys injected instructions.
- `measure`: utility, utility under attack and targeted ASR for a planner on both benchmarks.
"""
from mpa_jax.harness.security.guard import DEFENSES, GuardedEnv, SecurityConfig  # noqa: F401
from mpa_jax.harness.security.policy import Policy, PolicyError, load_policy  # noqa: F401
