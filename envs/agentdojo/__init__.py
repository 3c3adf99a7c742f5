"""AgentDojo (`agentdojo==0.1.35`) as the `agentdojo` env kind: its four suites' user tasks, tools, runtime and
utility checks (`envs/agentdojo/data.py`: tasks, splits, the suite -> domain mapping; `envs/agentdojo/env.py`:
the env, with the injection-task hooks). Importing this package does not import agentdojo.
"""
from mpa_jax.envs.agentdojo.data import SUITE_DOMAINS, SUITES, AgentDojoUnavailable, make_tasks  # noqa: F401
from mpa_jax.envs.agentdojo.env import AgentDojoEnv  # noqa: F401
