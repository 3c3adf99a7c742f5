"""AgentDojo's suites (from the `agentdojo` wheel) as project Tasks and ToolSpecs (no jax).

Suites of benchmark version `benchmark_version` (default v1.2.2): workspace (40 user tasks), travel (20),
banking (16), slack (21): 97 user tasks. Each suite has one YAML environment and its tools; a user task has
a prompt, a `ground_truth(pre_env)` list of calls, a `GROUND_TRUTH_OUTPUT` and `utility(...)`.

Mapping of suites to the project's domains (each suite is one app family; the category is the suite):

    workspace -> communication (email, calendar, cloud drive)   travel -> travel
    banking   -> payments_banking                               slack  -> communication

Splits: AgentDojo has no scenarios beyond the user task (a suite's tasks share its environment), so the split
is by user task, per suite: a suite's tasks are ordered by a seeded hash (`split_seed`); the first
`test_fraction` of them (rounded, at least one) are test, the next `dev_fraction` dev, the rest train.

Only `agentdojo.task_suite`, `agentdojo.functions_runtime` and `agentdojo.types` are used: the agent pipeline
(and its vendor SDKs' clients) never runs. Importing `agentdojo.task_suite` does import the pipeline package
(its module imports the vendor SDKs), which is why the wheel is installed with its dependencies.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Sequence

from mpa_jax.envs.contract import Task, ToolSpec

WHEEL = "agentdojo==0.1.35"
INSTALL_HINT = f"pip install {WHEEL}  (make install-bench)"
SUITES: tuple[str, ...] = ("workspace", "travel", "banking", "slack")
SUITE_DOMAINS: dict[str, str] = {"workspace": "communication", "travel": "travel", "banking": "payments_banking",
                                 "slack": "communication"}


class AgentDojoUnavailable(RuntimeError):
    """`agentdojo` is not installed (the message says how to install it)."""


@functools.lru_cache(maxsize=None)
def suites(version: str) -> dict[str, Any]:
    """AgentDojo's TaskSuites of a benchmark version, by name."""
    try:
        from agentdojo.task_suite import get_suites
    except ImportError as e:
        raise AgentDojoUnavailable(f"the agentdojo env needs {WHEEL} ({e}): {INSTALL_HINT}") from None
    found = get_suites(version)
    missing = [s for s in SUITES if s not in found]
    if missing:
        raise ValueError(f"AgentDojo {version} has no suite {missing[0]!r}")
    return {s: found[s] for s in SUITES}


def default_environment(suite: Any, injections: dict[str, str] | None = None) -> Any:
    """A fresh copy of the suite's environment with its injection vectors at their defaults (the utility run),
    or with the given injections over them (AgentDojo's security runs: `injections` from an attack)."""
    if injections:
        return suite.load_and_inject_default_environment({**suite.get_injection_vector_defaults(), **injections})
    return _loaded(suite).model_copy(deep=True)


@functools.lru_cache(maxsize=None)
def _loaded(suite: Any) -> Any:
    # parsing a suite's YAML takes up to ~1.6 s (workspace); a deep copy of the result ~30 ms
    return suite.load_and_inject_default_environment(suite.get_injection_vector_defaults())


def close_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic input schema as a tool's parameters: titles dropped, the top object closed."""
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "title" or not isinstance(x, str)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    out = strip(schema)
    out.setdefault("properties", {})
    out.setdefault("required", [])
    out["additionalProperties"] = False
    return out


def tool_spec(suite_name: str, function: Any) -> ToolSpec:
    """One AgentDojo `Function` as a ToolSpec (app = the suite)."""
    return ToolSpec(name=function.name, app=suite_name, domain=SUITE_DOMAINS[suite_name], description=function.description,
                    parameters=close_schema(function.parameters.model_json_schema()))


def splits(names: Sequence[str], suite_name: str, seed: int, test_fraction: float, dev_fraction: float) -> dict[str, str]:
    """User task id -> split, for one suite (module docstring)."""
    if not (0 < test_fraction < 1 and 0 <= dev_fraction < 1 and test_fraction + dev_fraction < 1):
        raise ValueError(f"config.envs.agentdojo: test_fraction ({test_fraction}) and dev_fraction ({dev_fraction}) must"
                         " be fractions that leave train tasks")
    order = sorted(names, key=lambda n: hashlib.sha256(f"agentdojo:{seed}:{suite_name}:{n}".encode()).hexdigest())
    n_test = max(1, round(test_fraction * len(order)))
    n_dev = round(dev_fraction * len(order))
    return {n: "test" if r < n_test else "dev" if r < n_test + n_dev else "train" for r, n in enumerate(order)}


def gold_plan(suite: Any, user_task: Any, environment: Any) -> list[dict[str, Any]]:
    """The task's ground truth (on a copy of its start environment) as an oracle plan, then its output."""
    start = user_task.init_environment(environment)
    plan: list[dict[str, Any]] = []
    for call in user_task.ground_truth(start.model_copy(deep=True)):
        args = dict(call.args)
        json.dumps(args)  # ground truth arguments are JSON data (a task whose are not fails here, loudly)
        plan.append({"kind": "tool_call", "name": call.function, "arguments": args, "why": f"I'll call {call.function}."})
    plan.append({"kind": "message", "text": user_task.GROUND_TRUTH_OUTPUT or "Done.", "why": "That completes the request."})
    return plan


def make_tasks(split: str, *, version: str, split_seed: int, test_fraction: float, dev_fraction: float) -> list[Task]:
    """The user tasks of `split` ("train" | "dev" | "test" | "all"), suite by suite."""
    if split not in ("train", "dev", "test", "all"):
        raise ValueError(f"agentdojo split must be train, dev, test or all, got {split!r}")
    out = []
    for name, suite in suites(version).items():
        tools = [f.name for f in suite.tools]
        task_split = splits(list(suite.user_tasks), name, split_seed, test_fraction, dev_fraction)
        for tid, ut in suite.user_tasks.items():
            if split != "all" and task_split[tid] != split:
                continue
            out.append(Task(
                id=f"agentdojo/{name}/{tid}", domain=SUITE_DOMAINS[name], category=f"agentdojo_{name}",
                difficulty=int(getattr(getattr(ut, "DIFFICULTY", None), "value", 1)), instruction=ut.PROMPT, tools=tools,
                verifier={"checker": "agentdojo utility", "suite": name, "user_task": tid},
                gold=gold_plan(suite, ut, default_environment(suite)),
                template=f"agentdojo_{name}_{tid}", split=task_split[tid], seed=0,
                metadata={"env": "agentdojo", "suite": name, "user_task": tid, "benchmark_version": version}))
    return out
