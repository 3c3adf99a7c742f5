"""How a simulated episode is scored, and the rule that such scores stay out of the benchmark.

A task's verifier lists goals over the end state (a field's values, one new matching row, a deleted row);
every other row must be unchanged and the episode must end with a message to the user. Simulated tasks are
training-only: `refuse_simulated` guards anything that reports benchmark scores.
"""
from __future__ import annotations

from typing import Any, Iterable

from mpa_jax.envs.contract import Check, Task, Verification


def score(task: Task, end: dict[str, dict[str, dict[str, Any]]], final_message: str | None) -> Verification:
    """Goals over the end state `end` ({table: {id: row}}), nothing else changed, and a final message."""
    v = task.verifier
    start = task.metadata.get("sim_state", {})
    checks, covered = [], set()
    for g in v.get("goals", []):
        table = g["table"]
        if g["kind"] == "field":
            row = end.get(table, {}).get(g["id"])
            ok = row is not None and all(row.get(k) == x for k, x in g["values"].items())
            covered.add((table, g["id"]))
            checks.append(Check(g.get("name", "field"), ok, f"{table}/{g['id']} {g['values']}"))
        elif g["kind"] == "new_row":
            hits = [rid for rid, r in end.get(table, {}).items()
                    if rid not in start.get(table, {}) and all(r.get(k) == x for k, x in g["match"].items())]
            covered.update((table, h) for h in hits)
            checks.append(Check(g.get("name", "new_row"), len(hits) == 1, f"{len(hits)} new row(s) match"))
        elif g["kind"] == "deleted":
            covered.add((table, g["id"]))
            checks.append(Check(g.get("name", "deleted"), g["id"] not in end.get(table, {}), f"{table}/{g['id']} gone"))
    stray = [(t, rid) for t in set(start) | set(end) for rid in set(start.get(t, {})) | set(end.get(t, {}))
             if start.get(t, {}).get(rid) != end.get(t, {}).get(rid) and (t, rid) not in covered]
    checks.append(Check("nothing_else_changed", not stray, f"{len(stray)} other row(s) changed"))
    checks.append(Check("final_message", bool(final_message), "a final message was sent"))
    passed = sum(c.weight for c in checks if c.passed)
    total = sum(c.weight for c in checks)
    success = all(c.passed for c in checks)
    return Verification(success=success, score=1.0 if success else round(passed / total, 4), checks=checks)


def refuse_simulated(trajectories: Iterable[Any]) -> None:
    """Raise ValueError if any trajectory came from a simulated env: benchmark scores never include them."""
    for t in trajectories:
        prov = getattr(t, "provenance", {}) or {}
        if prov.get("env") == "simulated" or str(getattr(t, "task_id", "")).startswith("sim/"):
            raise ValueError(f"trajectory {getattr(t, 'task_id', '?')}: simulated episodes are for training only and"
                             " never count in benchmark scores")
