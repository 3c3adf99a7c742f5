"""Gold-plan arguments in the tool schema's parameter order, whatever the task file's key order.

Why: a split generated in memory keeps each tool call's arguments in the order of the tool's schema
(the order the compact context lists them in: `create_event(title, date, start_time, ...)`), but the
task cache and every task JSONL are written as canonical JSON with sorted keys, so tasks read back
from disk carry alphabetical arguments and the oracle then demonstrates `{"date", "start_time",
"title"}`. The shipped starter learned the schema order (its split was generated in memory); SFT on
alphabetical demonstrations taught it a second order and cost it ~10 points of dev success (the
demo's refresh: 101 of 225 tool calls INVALID_ARGUMENTS, repeated keys). Ordering by the schema makes
the demonstrations independent of how the tasks were stored.
"""
from __future__ import annotations

import dataclasses
from typing import Any


def _ordered(value: Any, schema: dict[str, Any] | None) -> Any:
    """`value` with every object's keys in `schema`'s `properties` order (unknown keys after, as they came)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, dict):
            return value
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: _ordered(value[k], props.get(k)) for k in keys}
    if isinstance(value, list):
        return [_ordered(v, schema.get("items")) for v in value]
    return value


def _step(step: dict[str, Any], tools: dict[str, Any]) -> dict[str, Any]:
    out = dict(step)
    tool = tools.get(step.get("name", ""))
    if step.get("kind") == "tool_call" and tool is not None and isinstance(step.get("arguments"), dict):
        out["arguments"] = _ordered(step["arguments"], tool.spec.parameters)
    if isinstance(step.get("fallbacks"), list):
        out["fallbacks"] = [_step(f, tools) if isinstance(f, dict) else f for f in step["fallbacks"]]
    return out


def schema_ordered(task: Any) -> Any:
    """A copy of `task` whose gold tool calls (and their fallbacks) list arguments in schema order."""
    from mpa_jax.envs.tools import TOOLS

    return dataclasses.replace(task, gold=[_step(s, TOOLS) if isinstance(s, dict) else s for s in task.gold])
