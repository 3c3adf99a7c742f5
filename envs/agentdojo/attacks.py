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

Unobservable pairs: an attack can overwrite the very data the user's goal depends on (banking's `injection_bill_text`
vector is the whole body of the bill `user_task_0` pays, IBAN included). `metadata["unobservable"]` lists the values
of the ground truth's call arguments that the attack deleted from the world: each occurs in the user task's start
environment without the attack, occurs nowhere in the attacked one and is not in the user's request
(`unobservable_values`). A pair with any is one no honest agent can complete (the value is nowhere to be read);
`harness.security.measure` reports utility under attack over all pairs and over the observable ones.
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
    unobservable = unobservable_values(user_task.PROMPT, gold, user_task.init_environment(data.default_environment(suite)),
                                       start)
    attacker_calls = [{"name": c.function, "arguments": dict(c.args)} for c in inj_task.ground_truth(start)]
    meta = dict(base.metadata, injections=injections, injection_task=injection_task_id, attack=attack,
                injection={"texts": sorted(set(injections.values())), "attacker_calls": attacker_calls, "phrasing": attack,
                           "goal": injection_task_id, "vector": ",".join(sorted(injections))},
                unobservable=unobservable)
    return Task(id=f"{base.id}/{injection_task_id}/{attack}", domain=base.domain, category=base.category,
                difficulty=base.difficulty, instruction=base.instruction, tools=list(base.tools), verifier=dict(base.verifier),
                gold=gold, template=base.template, split=base.split, seed=base.seed, metadata=meta)


def _leaves(environment: Any) -> list[str]:
    """Every scalar of an AgentDojo environment, as whitespace-normalised lower-case text."""
    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from walk(v)
        elif isinstance(x, list):
            for v in x:
                yield from walk(v)
        elif x is not None:
            yield x
    return [_norm(v) for v in walk(json.loads(environment.model_dump_json()))]


def _norm(v: Any) -> str:
    return " ".join(str(v).lower().split())


def unobservable_values(prompt: str, gold: list[dict[str, Any]], clean_env: Any, attacked_env: Any) -> list[str]:
    """The ground truth's call argument values that the attack deleted (module docstring): present (as a substring of
    some value) in `clean_env`, absent from every value of `attacked_env` and from `prompt`. Substring matching errs
    towards "observable" (a short number occurs somewhere in almost any world)."""
    clean, attacked, said = _leaves(clean_env), _leaves(attacked_env), _norm(prompt)
    out: list[str] = []
    for step in gold:
        if step.get("kind") != "tool_call":
            continue
        stack = [step.get("arguments") or {}]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
            elif x is not None and not isinstance(x, bool):
                n = _norm(x)
                if n and any(n in c for c in clean) and not any(n in a for a in attacked) and n not in said and str(x) not in out:
                    out.append(str(x))
    return out


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
