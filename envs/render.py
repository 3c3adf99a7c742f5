"""The ONE way actions and feedback become chat messages (OpenAI style), shared by oracle demonstrations
and the agent loop so that SFT data and rollouts look identical to the model.

A delegate action is rendered as a call of the `delegate` tool ({"agent", "instruction"}); the env accepts
that tool call back as a delegation, so text-level parsing needs no special case.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from mpa_jax.envs.contract import Action, ContractError, Feedback, canonical_json


def action_to_message(action: Action | Sequence[Action], reasoning: str | None = None) -> dict[str, Any]:
    """One assistant message for one action, or for several tool_call/delegate actions sent together."""
    actions = [action] if isinstance(action, Action) else list(action)
    if not actions:
        raise ContractError("action_to_message: no actions")
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if len(actions) == 1 and actions[0].kind in ("message", "finish"):
        msg["content"] = actions[0].text
        return msg
    calls = []
    for a in actions:
        if a.kind == "tool_call":
            name, args = a.name, a.arguments
        elif a.kind == "delegate":
            name, args = "delegate", {"agent": a.name, "instruction": a.text}
        else:
            raise ContractError(f"action_to_message: a {a.kind!r} action cannot share a message with tool calls")
        call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
        if a.call_id:
            call["id"] = a.call_id
        calls.append(call)
    msg["tool_calls"] = calls
    return msg


def feedback_to_message(feedback: Feedback) -> dict[str, Any]:
    """A `tool` message whose content is canonical JSON of status and result, or error code, message, hint."""
    if feedback.status == "ok":
        body: dict[str, Any] = {"status": "ok", "result": feedback.result}
    else:
        code = feedback.error_code.value if hasattr(feedback.error_code, "value") else feedback.error_code
        body = {"status": "error", "error": code, "message": feedback.message}
        if feedback.hint:
            body["hint"] = feedback.hint
        if feedback.result is not None:
            body["result"] = feedback.result
    msg = {"role": "tool", "content": canonical_json(body)}
    if feedback.call_id:
        msg["tool_call_id"] = feedback.call_id
    return msg


def tool_call_to_action(call: dict[str, Any], raw: str = "", agent: str = "planner") -> Action:
    """Parse one OpenAI-style tool call ({"function": {"name", "arguments"}} or {"name", "arguments"}).

    Arguments may be a dict or a JSON string; undecodable strings are kept as the raw string so that the env
    answers INVALID_ARGUMENTS instead of the parser raising.
    """
    fn = call.get("function", call)
    name = fn.get("name", "")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    call_id = call.get("id", "")
    if name == "delegate" and isinstance(args, dict) and set(args) == {"agent", "instruction"}:
        return Action(kind="delegate", name=str(args["agent"]), text=str(args["instruction"]), call_id=call_id, raw=raw, agent=agent)
    return Action(kind="tool_call", name=name, arguments=args, call_id=call_id, raw=raw, agent=agent)


def message_to_actions(message: dict[str, Any]) -> list[Action]:
    """Inverse of action_to_message: the actions an assistant message carries."""
    calls = message.get("tool_calls") or []
    if calls:
        return [tool_call_to_action(c) for c in calls]
    return [Action.message(message.get("content") or "")]
