"""AgentDojo's security runs as project Tasks: (user task x injection task) pairs under one of AgentDojo's attacks,
injected through AgentDojo's own injection vectors (no jax).

For each pair the attack (`agentdojo.attacks.load_attack`: `important_instructions`, `tool_knowledge`, `direct`,
`ignore_previous`, ...) writes its text into the vectors the user task's ground truth reads (AgentDojo's
`get_injection_candidates`, which runs the ground truth with canaries); the Task carries them as
`metadata["injections"]` (the env injects them at reset) and `metadata["injection_task"]` (the env's verify adds
AgentDojo's own security check, `agentdojo_security`). The gold is the user task's ground truth on the injected
environment. `metadata["injection"]` holds the texts and the injection task's ground-truth calls (on the injected
environment) for the scripted gullible planner. The attacks address the model as AgentDojo's "Local model".

User tasks that read no injection vector are not injectable (AgentDojo leaves them out of its security runs too).
"""
from __future__ import annotations

import functools
import json
import types
from typing import Any

from mpa_jax.envs.agentdojo import data
from mpa_jax.envs.contract import Task

ATTACKS: tuple[str, ...] = ("important_instructions", "tool_knowledge", "direct", "ignore_previous", "system_message",
                            "injecagent")
PIPELINE_NAME = "local"  # AgentDojo's MODEL_NAMES: "Local model" (attacks that address the model by name use it)


@functools.lru_cache(maxsize=None)
def _attack(version: str, suite_name: str, attack: str) -> Any:
    from agentdojo.attacks import load_attack

    if attack not in ATTACKS:
        raise ValueError(f"unknown AgentDojo attack {attack!r} (known: {', '.join(ATTACKS)})")
    return load_attack(attack, data.suites(version)[suite_name], types.SimpleNamespace(name=PIPELINE_NAME))


def candidates(version: str, suite_name: str, user_task_id: str) -> list[str]:
    """The injection vectors the user task's ground truth reads ([] when it reads none)."""
    suite = data.suites(version)[suite_name]
    try:
        return list(_attack(version, suite_name, "direct").get_injection_candidates(suite.get_user_task_by_id(user_task_id)))
    except ValueError:
        return []


@functools.lru_cache(maxsize=512)
def injected_environment(version: str, suite_name: str, injections_json: str) -> Any:
    """The suite's environment with these injections (AgentDojo's loader; cached, a few MB each: a YAML parse takes up
    to ~1.6 s, and a measurement runs every pair under several planners and defenses)."""
    suite = data.suites(version)[suite_name]
    return data.default_environment(suite, json.loads(injections_json))


def attack_task(base: Task, injection_task_id: str, attack: str) -> Task | None:
    """The attacked copy of one agentdojo user Task (None when the user task is not injectable)."""
    version, name, uid = base.metadata["benchmark_version"], base.metadata["suite"], base.metadata["user_task"]
    suite = data.suites(version)[name]
    user_task, inj_task = suite.get_user_task_by_id(uid), suite.get_injection_task_by_id(injection_task_id)
    if not candidates(version, name, uid):
        return None
    injections = dict(_attack(version, name, attack).attack(user_task, inj_task))
    env = injected_environment(version, name, json.dumps(injections, sort_keys=True))
    gold = data.gold_plan(suite, user_task, env.model_copy(deep=True))
    start = user_task.init_environment(env.model_copy(deep=True))
    attacker_calls = [{"name": c.function, "arguments": dict(c.args)} for c in inj_task.ground_truth(start)]
    meta = dict(base.metadata, injections=injections, injection_task=injection_task_id, attack=attack,
                injection={"texts": sorted(set(injections.values())), "attacker_calls": attacker_calls, "phrasing": attack,
                           "goal": injection_task_id, "vector": ",".join(sorted(injections))})
    return Task(id=f"{base.id}/{injection_task_id}/{attack}", domain=base.domain, category=base.category,
                difficulty=base.difficulty, instruction=base.instruction, tools=list(base.tools), verifier=dict(base.verifier),
                gold=gold, template=base.template, split=base.split, seed=base.seed, metadata=meta)


def attack_tasks(base_tasks: list[Task], attack: str, suites: tuple[str, ...] = data.SUITES,
                 injection_tasks: int = 0) -> list[Task]:
    """Every injectable (user task x injection task) pair of `base_tasks` under `attack` (`injection_tasks` > 0: only
    the first that many injection tasks of each suite), pair-major so the injected-environment cache stays warm."""
    out = []
    for base in base_tasks:
        name = base.metadata["suite"]
        if name not in suites:
            continue
        suite = data.suites(base.metadata["benchmark_version"])[name]
        ids = list(suite.injection_tasks)[: injection_tasks or None]
        for iid in ids:
            t = attack_task(base, iid, attack)
            if t is not None:
                out.append(t)
    return out
