"""What passes between the env and a simulator backend: the prompt it gets, the reply format it must answer,
and what makes a reply valid (the JSON schema first, then semantically against the tool and the store)."""
from __future__ import annotations

import json
import re
from typing import Any

from mpa_jax.envs.contract import Task, canonical_json
from mpa_jax.envs.schema import SchemaError, compile_schema
from mpa_jax.envs.simulated.catalog import SimTool
from mpa_jax.envs.simulated.store import InvalidReply, SimState  # noqa: F401  (InvalidReply: re-exported)


# The one reply shape every backend must answer; `delta` is the typed change the store applies.
REPLY_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "error"]},
        "result": {},
        "error_code": {"type": "string", "enum": ["NOT_FOUND", "INVALID_ARGUMENTS", "PRECONDITION_FAILED", "AMBIGUOUS"]},
        "message": {"type": "string", "maxLength": 500},
        "delta": {"type": "array", "maxItems": 20, "items": {
            "type": "object",
            "properties": {"op": {"type": "string", "enum": ["insert", "update", "delete"]}, "table": {"type": "string"},
                           "id": {"type": "string", "minLength": 1, "maxLength": 64},
                           "row": {"type": "object"}, "changes": {"type": "object"}},
            "required": ["op", "table", "id"], "additionalProperties": False}},
    },
    "required": ["status", "delta"],
    "additionalProperties": False,
}
_validate_reply = compile_schema(REPLY_SCHEMA)


def simulator_prompt(tool: SimTool, args: dict[str, Any], task: Task, state: SimState, ledger: list[dict[str, Any]]) -> str:
    """The simulator's prompt. Machine-read sections are one JSON line each (`CALL:`, `STATE:`)."""
    recent = [{k: e[k] for k in ("name", "arguments", "status", "result") if k in e} for e in ledger[-8:]]
    return "\n".join([
        "You simulate a phone app's backend. Answer the tool call below as the app would, consistently with the"
        " app state and the earlier calls. Reply with exactly one JSON object and nothing else:",
        '{"status": "ok"|"error", "result": <object matching RETURNS>, "error_code": "NOT_FOUND"|...,'
        ' "message": "...", "delta": [{"op": "insert"|"update"|"delete", "table": "...", "id": "...",'
        ' "row"|"changes": {...}}]}',
        "Reads never write (empty delta). A write's delta says exactly what changed. New ids: <entity>_<n>.",
        f"TASK: {task.instruction}",
        "TOOL: " + canonical_json(tool.spec.to_openai()["function"]),
        "RETURNS: " + canonical_json(tool.spec.returns),
        "STATE: " + canonical_json({"table": tool.entity.table, "rows": state.rows(tool.entity.table)}),
        "LEDGER: " + canonical_json(recent),
        "CALL: " + canonical_json({"name": tool.spec.name, "arguments": args}),
    ])


def parse_reply(text: str) -> dict[str, Any]:
    """The reply's JSON object (a ```json fence or surrounding prose is tolerated); InvalidReply otherwise."""
    if not isinstance(text, str):
        raise InvalidReply(f"the backend returned {type(text).__name__}, not text")
    m = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    body = m.group(1) if m else text[text.find("{"): text.rfind("}") + 1] if "{" in text else ""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, ValueError) as e:
        raise InvalidReply(f"reply is not a JSON object: {e}") from None
    try:
        _validate_reply(obj)
    except SchemaError as e:
        raise InvalidReply(f"reply breaks the schema: {e}") from None
    return obj


def check_reply(tool: SimTool, args: dict[str, Any], reply: dict[str, Any], state: SimState) -> dict[str, Any]:
    """Semantic validation against the tool and the store; returns the reply or raises InvalidReply."""
    delta = reply["delta"]
    if any(d["table"] != tool.entity.table for d in delta):
        raise InvalidReply(f"{tool.spec.name} may only change {tool.entity.table}")
    state.check_delta(delta)
    if reply["status"] == "error":
        if delta:
            raise InvalidReply("an error reply must not change state")
        if "error_code" not in reply:
            raise InvalidReply("an error reply needs error_code")
        return reply
    if "result" not in reply:
        raise InvalidReply("an ok reply needs result")
    try:
        tool.validate_result(reply["result"])
    except SchemaError as e:
        raise InvalidReply(f"result breaks {tool.spec.name}'s RETURNS schema: {e}") from None
    rows, res, op = state.rows(tool.entity.table), reply["result"], tool.op
    if op in ("list", "get"):
        if delta:
            raise InvalidReply(f"{tool.spec.name} is a read and must not change state")
        for item in res["items"] if op == "list" else [res]:
            if rows.get(item["id"]) != item:
                raise InvalidReply(f"result row {item['id']!r} disagrees with the state store")
        if op == "get" and res["id"] != args["id"]:
            raise InvalidReply(f"get returned {res['id']!r}, asked for {args['id']!r}")
        return reply
    want_op = {"create": "insert", "update": "update", "delete": "delete"}[op]
    if op != "update" or len(args) > 1:
        if len(delta) != 1 or delta[0]["op"] != want_op:
            raise InvalidReply(f"{tool.spec.name} must answer exactly one {want_op} delta")
    if op == "create":
        d = delta[0]
        if {**d["row"], "id": d["id"]} != res or any(res.get(k) != v for k, v in args.items()):
            raise InvalidReply("create's result must be the inserted row, with the given arguments")
    elif op == "update":
        if args["id"] not in rows:
            raise InvalidReply(f"update of missing id {args['id']!r} must be a NOT_FOUND error")
        changes = {k: v for k, v in args.items() if k != "id"}
        if delta and (delta[0]["id"] != args["id"] or delta[0]["changes"] != changes):
            raise InvalidReply("update's delta must carry exactly the requested changes")
        if res != {**rows[args["id"]], **changes}:
            raise InvalidReply("update's result must be the updated row")
    elif delta[0]["id"] != args["id"] or res != {"deleted": args["id"]}:
        raise InvalidReply("delete must delete the requested id and answer it")
    return reply
