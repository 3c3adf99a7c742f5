"""The quality gate every generated task passes before it is emitted (DESIGN §4).

1. The gold passes using only the tool API (run by the oracle's canonical policy).
2. Replaying the gold gives the identical ledger (chained hash) and verdict.
3. Doing nothing fails.
4. At least two corrupted solutions exist and all of them fail: skip a step, wrong value, wrong target.
5. The gold never uses an id the planner could not have seen (instruction, history or earlier feedback).
"""
from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

from mpa_jax.envs.contract import Task, canonical_json
from mpa_jax.envs.oracle import run_plan
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.envs.tools import TOOLS

ID = re.compile(r"^[a-z][a-z_]*_[0-9]+$")


def _last_write(plan: list[dict[str, Any]]) -> int | None:
    for i in range(len(plan) - 1, -1, -1):
        s = plan[i]
        if s["kind"] == "tool_call" and TOOLS[s["name"]].kind == "write":
            return i
    return None


def _perturb(tool: str, key: str, v: Any) -> Any:
    sch = TOOLS[tool].spec.parameters["properties"].get(key, {})
    if isinstance(v, bool):
        return not v
    if "enum" in sch:
        others = [x for x in sch["enum"] if x != v]
        return others[0] if others else None
    if isinstance(v, int):
        hi = sch.get("maximum")
        return v - 1 if hi is not None and v + 1 > hi else v + 1
    if isinstance(v, float):
        hi = sch.get("maximum")
        return round(v - 1.5, 2) if hi is not None and v + 1.5 > hi else round(v + 1.5, 2)
    if isinstance(v, str):
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
            return (dt.date.fromisoformat(v) + dt.timedelta(days=1)).isoformat()
        if re.fullmatch(r"\d{2}:\d{2}", v):
            return f"{(int(v[:2]) + 1) % 24:02d}{v[2:]}"
        return "Something else entirely"
    return None


def corruptions(task: Task) -> list[tuple[str, list[dict[str, Any]]]]:
    """Corrupted copies of the gold plan that a correct verifier must reject."""
    gold = task.gold
    out: list[tuple[str, list[dict[str, Any]]]] = []
    w = _last_write(gold)
    # skipped step: the last state-changing call, or else the final message
    if w is not None:
        out.append(("skip_step", gold[:w] + gold[w + 1:]))
    elif gold and gold[-1]["kind"] == "message":
        out.append(("skip_step", gold[:-1]))
    writes = [i for i in range(len(gold) - 1, -1, -1) if gold[i]["kind"] == "tool_call" and TOOLS[gold[i]["name"]].kind == "write"]
    # wrong value: the latest write with a perturbable non-id argument
    for i in writes:
        step = gold[i]
        built = False
        for key, v in step["arguments"].items():
            if isinstance(v, str) and ID.match(v):
                continue
            nv = _perturb(step["name"], key, v)
            if nv is not None and nv != v:
                plan = copy.deepcopy(gold)
                plan[i]["arguments"][key] = nv
                plan[i].pop("fallbacks", None)
                out.append(("wrong_value", plan))
                built = True
                break
        if built:
            break
    if gold and gold[-1]["kind"] == "message" and (w is None or task.verifier.get("answer")):
        plan = copy.deepcopy(gold)
        plan[-1]["text"] = "Done."
        out.append(("wrong_answer", plan))
    # wrong target (recipient / row): another existing id of the same entity, in the latest write that has one
    for i in writes:
        step = gold[i]
        hit = next((k for k, v in step["arguments"].items() if isinstance(v, str) and ID.match(v)), None)
        if hit is not None:
            prefix, n = step["arguments"][hit].rsplit("_", 1)
            plan = copy.deepcopy(gold)
            plan[i]["arguments"][hit] = f"{prefix}_{int(n) + 1 if int(n) > 1 else 2}"
            out.append(("wrong_target", plan))
            break
    return out


def _visible_ids(text: str) -> set[str]:
    return set(re.findall(r"\b[a-z][a-z_]*_[0-9]+\b", text))


def check_task(task: Task, env: SandboxEnv | None = None) -> str | None:
    """Run the gate; None when the task passes, else the reason it is rejected."""
    env = env or SandboxEnv()
    ep = run_plan(env, task, task.gold)
    if not ep.verification.success:
        bad = [f"{c.name}: {c.detail}" for c in ep.verification.checks if not c.passed]
        return "gold fails: " + "; ".join(bad)
    h1, v1 = env.ledger_hash, ep.verification.to_json()
    ep2 = run_plan(env, task, task.gold)
    if env.ledger_hash != h1 or ep2.verification.to_json() != v1:
        return "gold replay is not identical"
    # only planner-visible ids: instruction, history, and feedback that came before the call
    seen = _visible_ids(task.instruction + " " + " ".join(t["content"] for t in task.history))
    for st in ep.steps:
        a = st.action
        if a.kind == "tool_call":
            for v in a.arguments.values():
                if isinstance(v, str) and ID.match(v) and v not in seen:
                    return f"gold uses id {v} before the planner could see it"
        if st.feedback is not None:
            seen |= _visible_ids(canonical_json(st.feedback.result) + " " + st.feedback.message + " " + st.feedback.hint)
    env.reset(task)
    if env.verify().success:
        return "doing nothing passes"
    cs = corruptions(task)
    if len(cs) < 2:
        return f"only {len(cs)} corrupted solution(s) can be built"
    for name, plan in cs:
        if run_plan(env, task, plan).verification.success:
            return f"corrupted solution {name!r} passes"
    return None
