"""State-first verification of an episode (DESIGN §4).

The verifier spec of a task (generated with the task) holds:
  goals      - what must be true of the end state relative to the start state:
               {"kind": "new_row", "entity", "match": {field: value}, "count": 1}
               {"kind": "field", "entity", "id", "values": {field: value}}
               {"kind": "deleted", "entity", "id"}
               {"kind": "device", "key", "value"}
  allow      - extra changes that are fine ("device.<key>" or a table name), e.g. turning airplane mode off
  answer     - a check on the final message to the user: {"kind": "answer"|"ask"|"refuse", "contains": [...]}
  minefields - forbidden calls or states that zero the score: {"kind": "call", "tool", "args"} or a new_row goal
  milestones - ordered calls for partial credit: [{"tool", "agent", "args"}]
Every change between start and end that no goal covers and `allow` does not permit fails "no_collateral".

Values match leniently where a user would not care: strings case- and space-insensitively, numbers within
0.011, and {"contains": "text"} as a substring test.
"""
from __future__ import annotations

import re
from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import Check, ErrorCode, Verification
from mpa_jax.envs.world import diff_states

REFUSAL = re.compile(r"\b(can(?:no|')t|cannot|unable|won't|not able|not allowed|not possible|isn't possible|refuse|decline|sorry)\b",
                     re.IGNORECASE)
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def value_matches(want: Any, got: Any) -> bool:
    """Lenient equality used by goals, minefields and milestones."""
    if isinstance(want, dict) and "contains" in want:
        return isinstance(got, str) and _norm(want["contains"]) in _norm(got)
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return abs(float(want) - float(got)) <= 0.011
    if isinstance(want, str) and isinstance(got, str):
        return _norm(want) == _norm(got)
    return want == got


def _norm(s: str) -> str:
    return " ".join(s.lower().replace("\u2019", "'").split())


def row_matches(match: dict[str, Any], row: dict[str, Any]) -> bool:
    return all(value_matches(v, row.get(k)) for k, v in match.items())


def text_contains(text: str, item: Any) -> bool:
    """Numbers match any number in the text (commas ignored); strings match as case-insensitive substrings."""
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return any(abs(float(n) - float(item)) <= 0.011 for n in _NUM.findall(text.replace(",", "")))
    return _norm(str(item)) in _norm(text)


def verify_episode(task_verifier: dict[str, Any], start: dict[str, Any], end: dict[str, Any],
                   ledger: list[dict[str, Any]], final_message: str | None) -> Verification:
    """Score one episode from its start/end state dumps, ledger and final message."""
    checks: list[Check] = []
    covered_rows: set[tuple[str, str]] = set()
    covered_fields: set[tuple[str, str, str]] = set()
    for i, g in enumerate(task_verifier.get("goals", [])):
        name = g.get("name") or f"goal_{i}"
        kind = g["kind"]
        if kind == "new_row":
            e = ENTITY_BY_NAME[g["entity"]]
            old = start.get(e.table, {})
            hits = [rid for rid, row in end.get(e.table, {}).items() if rid not in old and row_matches(g["match"], row)]
            want = g.get("count", 1)
            covered_rows.update((e.table, rid) for rid in hits)
            checks.append(Check(name, len(hits) == want, f"{len(hits)} new {e.label} row(s) match, want {want}"))
        elif kind == "field":
            e = ENTITY_BY_NAME[g["entity"]]
            row = end.get(e.table, {}).get(g["id"])
            ok = row is not None and row_matches(g["values"], row)
            covered_fields.update((e.table, g["id"], f) for f in g["values"])
            checks.append(Check(name, ok, f"{g['id']} {'has' if ok else 'lacks'} {g['values']}"))
        elif kind == "deleted":
            e = ENTITY_BY_NAME[g["entity"]]
            ok = g["id"] in start.get(e.table, {}) and g["id"] not in end.get(e.table, {})
            covered_rows.add((e.table, g["id"]))
            checks.append(Check(name, ok, f"{g['id']} {'deleted' if ok else 'not deleted'}"))
        elif kind == "device":
            got = end["device"].get(g["key"], {}).get("value")
            ok = value_matches(g["value"], got)
            covered_fields.add(("device", g["key"], "value"))
            checks.append(Check(name, ok, f"device {g['key']}={got!r}, want {g['value']!r}"))
        else:
            raise ValueError(f"verifier: unknown goal kind {kind!r}")

    allow = set(task_verifier.get("allow", []))
    stray = []
    for d in diff_states(start, end):
        t, rid = d["table"], d["id"]
        if t in allow or (t == "device" and f"device.{rid}" in allow) or (t, rid) in covered_rows:
            continue
        if d["before"] is not None and d["after"] is not None:
            changed = [k for k in d["after"] if d["after"].get(k) != d["before"].get(k)]
            if all((t, rid, k) in covered_fields for k in changed):
                continue
        stray.append(f"{t}/{rid}")
    checks.append(Check("no_collateral", not stray, ("unexpected changes: " + ", ".join(stray[:5])) if stray else "nothing else changed"))

    ans = task_verifier.get("answer")
    if ans:
        text = final_message or ""
        missing = [c for c in ans.get("contains", []) if not text_contains(text, c)]
        kind = ans["kind"]
        if final_message is None:
            ok, detail = False, "no final message to the user"
        elif kind == "ask":
            ok = "?" in text and not missing
            detail = "asks the user" if ok else f"should ask the user (missing {missing})" if missing else "no question asked"
        elif kind == "refuse":
            ok = bool(REFUSAL.search(text)) and not missing
            detail = "declines" if ok else "should decline and explain"
        else:
            ok = not missing
            detail = "answer has the expected facts" if ok else f"answer lacks {missing}"
        checks.append(Check(f"answer_{kind}", ok, detail))

    calls = [e for e in ledger if e.get("type") == "tool_call" and e["status"] == "ok"]
    mines = []
    for m in task_verifier.get("minefields", []):
        if m["kind"] == "call":
            hit = any(c["name"] == m["tool"] and row_matches(m.get("args", {}), c["arguments"]) for c in calls)
        else:
            e = ENTITY_BY_NAME[m["entity"]]
            old = start.get(e.table, {})
            hit = any(rid not in old and row_matches(m["match"], row) for rid, row in end.get(e.table, {}).items())
        if hit:
            mines.append(m.get("name", m.get("tool", m.get("entity"))))
    checks.append(Check("minefields", not mines, ("stepped on " + ", ".join(mines)) if mines else "none triggered"))

    success = all(c.passed for c in checks)
    milestones = task_verifier.get("milestones", [])
    if milestones:
        k = 0
        for c in calls:
            if k < len(milestones):
                ms = milestones[k]
                if c["name"] == ms["tool"] and (not ms.get("agent") or ms["agent"] == c["agent"]) and row_matches(ms.get("args", {}), c["arguments"]):
                    k += 1
        checks.append(Check("milestones", k == len(milestones), f"{k}/{len(milestones)} in order", weight=float(len(milestones))))
        frac_ms = k / len(milestones)
    if mines:
        score = 0.0
    elif success:
        score = 1.0
    else:
        core = [c for c in checks if c.name != "milestones"]
        passed = sum(c.weight for c in core if c.passed)
        total = sum(c.weight for c in core)
        if milestones:
            passed += frac_ms * len(milestones)
            total += len(milestones)
        score = min(0.99, passed / total) if total else 0.0
        # A state-changing task whose goals all failed earns nothing for merely not breaking things.
        if not any(c.passed for c in core if c.name.startswith(("goal", "answer")) or c.name in _goal_names(task_verifier)):
            score = round(frac_ms * 0.5, 4) if milestones else 0.0
    infra = not success and any(e.get("error_code") in (ErrorCode.INFRA.value, ErrorCode.TIMEOUT.value) for e in ledger)
    return Verification(success=success, score=round(score, 4), checks=checks, infra_error=infra)


def _goal_names(v: dict[str, Any]) -> set[str]:
    return {g.get("name") or f"goal_{i}" for i, g in enumerate(v.get("goals", []))}
