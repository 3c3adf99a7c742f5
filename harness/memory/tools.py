"""Memory tools for the planner: `memory_search` and `memory_write`, as ToolSpecs plus a caller that
always answers with a Feedback (bad arguments -> INVALID_ARGUMENTS, never an exception)."""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from mpa_jax.envs.contract import ErrorCode, Feedback, ToolSpec
from mpa_jax.envs.schema import SchemaError, compile_schema
from mpa_jax.harness.memory.store import MemoryStore

_DATE = r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?"

SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="memory_search", app="memory", domain="utilities", kind="read",
        description=("Search what the user said in earlier conversations and the facts remembered about them. "
                     "Returns current facts (newest value wins, older values listed), the best matching past "
                     "turns with their dates, or nothing_known=true when memory holds nothing on the query."),
        parameters={
            "type": "object", "additionalProperties": False, "required": ["query"],
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 500, "description": "what to look up, in words"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "most turns to return (default 5)"},
                "since": {"type": "string", "pattern": _DATE, "description": "only turns at or after this date (YYYY-MM-DD)"},
                "until": {"type": "string", "pattern": _DATE, "description": "only turns before this date (YYYY-MM-DD)"},
            },
        },
        errors=["INVALID_ARGUMENTS"],
    ),
    ToolSpec(
        name="memory_write", app="memory", domain="utilities", kind="write",
        description=("Remember something for later conversations: a note in the user's words (content), and/or a "
                     "fact as attribute and value (a newer value for the same attribute replaces the older one, "
                     "which stays as history)."),
        parameters={
            "type": "object", "additionalProperties": False,
            "properties": {
                "content": {"type": "string", "minLength": 1, "maxLength": 2000, "description": "a note to remember"},
                "attribute": {"type": "string", "minLength": 1, "maxLength": 80, "description": "e.g. 'coach', 'seat preference'"},
                "value": {"type": "string", "minLength": 1, "maxLength": 500},
                "kind": {"type": "string", "enum": ["fact", "preference", "instruction", "event"]},
            },
        },
        errors=["INVALID_ARGUMENTS"],
    ),
)
_VALIDATORS = {s.name: compile_schema(s.parameters) for s in SPECS}


class MemoryTools:
    """Tool provider over one store: `specs()` for the registry, `call(name, arguments, call_id)` -> Feedback.

    `clock()` gives the timestamp of writes (ISO "YYYY-MM-DDTHH:MM"); pass the episode's frozen clock so
    that sandbox episodes stay deterministic. `session` labels turns written by the planner.
    """

    def __init__(self, store: MemoryStore, *, session: str = "planner",
                 clock: Callable[[], str] | None = None) -> None:
        self.store = store
        self.session = session
        self.clock = clock or (lambda: dt.datetime.now().strftime("%Y-%m-%dT%H:%M"))

    def specs(self) -> list[ToolSpec]:
        return list(SPECS)

    def names(self) -> set[str]:
        return {s.name for s in SPECS}

    def call(self, name: str, arguments: Any, call_id: str = "") -> Feedback:
        """Run one memory tool; every failure is a Feedback with a typed error code."""
        if name not in _VALIDATORS:
            return Feedback.error(ErrorCode.UNKNOWN_TOOL, f"unknown memory tool {name!r}", call_id,
                                  hint="use memory_search or memory_write")
        try:
            _VALIDATORS[name](arguments)
        except SchemaError as e:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"{name}: {e}", call_id,
                                  hint="fix the named argument and call again")
        try:
            if name == "memory_search":
                return self._search(arguments, call_id)
            return self._write(arguments, call_id)
        except ValueError as e:  # e.g. a date that matches the pattern but does not exist (2026-02-31)
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"{name}: {e}", call_id)
        except Exception as e:  # the store itself failed (disk, lock): the world's fault, not the policy's
            return Feedback.error(ErrorCode.INFRA, f"{name}: memory store error: {e}", call_id)

    def _search(self, a: dict[str, Any], call_id: str) -> Feedback:
        res = self.store.search(a["query"], limit=int(a.get("limit", 5)), since=a.get("since"), until=a.get("until"))
        if res.abstain:
            return Feedback(call_id=call_id, status="ok", message="nothing known",
                            result={"nothing_known": True, "reason": res.reason, "facts": [], "turns": []})
        facts = [{"attribute": f.attribute, "value": f.value, "kind": f.kind, "since": f.ts,
                  "earlier": [h["value"] for h in f.history]} for f in res.facts]
        turns = [{"date": h.ts, "session": h.session, "role": h.role, "content": h.content} for h in res.hits]
        return Feedback(call_id=call_id, status="ok", result={"nothing_known": False, "facts": facts, "turns": turns})

    def _write(self, a: dict[str, Any], call_id: str) -> Feedback:
        has_fact = "attribute" in a or "value" in a
        if not a.get("content") and not has_fact:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "memory_write: give content, or attribute and value",
                                  call_id, hint="e.g. {\"attribute\": \"coach\", \"value\": \"Dana Kim\"}")
        if has_fact and not ("attribute" in a and "value" in a):
            missing = "value" if "attribute" in a else "attribute"
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"memory_write: missing required argument {missing!r}",
                                  call_id, hint="a fact needs both attribute and value")
        ts = self.clock()
        out: dict[str, Any] = {}
        if a.get("content"):
            out["turn_id"] = self.store.ingest_turn(self.session, ts, "note", a["content"], extract=False)
        if has_fact:
            out["fact_id"] = self.store.write_fact(a["attribute"], a["value"], kind=a.get("kind", "fact"), ts=ts,
                                                   session=self.session, turn_id=out.get("turn_id"))
        return Feedback(call_id=call_id, status="ok", message="remembered", result=out)
