"""Tool calls in model text: parse both Qwen formats, and format them (the inverse).

Formats inside `<tool_call>...</tool_call>`:
- JSON (Qwen3, Hermes style): `{"name": NAME, "arguments": {...}}`.
- XML (Qwen3.5 / Qwen3-Coder): `<function=NAME><parameter=P>VALUE</parameter>...</function>`; a VALUE is
  JSON-decoded when it parses as JSON, else kept as the string.

Parsing never raises: anything malformed becomes a `ToolCallError` in `ParsedOutput.errors`, so the agent
loop can turn it into an error turn for the model. Error kinds:
`unclosed_think`, `unclosed_tag`, `unmatched_close`, `empty_call`, `bad_json`, `not_an_object`,
`missing_name`, `bad_name`, `missing_arguments`, `arguments_not_object`, `bad_xml`, `duplicate_parameter`,
`bad_input` (not a str).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

# Names we emit must survive both formats unescaped (the Qwen3 template pastes the name into a JSON string,
# the XML form into a tag); what models may *read* back is checked by the same pattern.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]*)>")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed tool call."""

    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {"name", "arguments"}}` form chat messages carry."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """A malformed part of the model's output: `kind` (see module doc), a one-line `message`, the `raw` text."""

    kind: str
    message: str
    raw: str


@dataclasses.dataclass
class ParsedOutput:
    """Model text split into reasoning, visible content, tool calls and parse errors."""

    content: str
    reasoning: str | None
    calls: list[ToolCall]
    errors: list[ToolCallError]

    @property
    def ok(self) -> bool:
        """True when nothing in the text was malformed."""
        return not self.errors

    def to_message(self) -> dict[str, Any]:
        """The OpenAI-style assistant message for this output (what the chat template renders back)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [c.to_openai() for c in self.calls]
        return msg


def parse_tool_calls(text: str) -> ParsedOutput:
    """Parse model output text (reasoning, content, tool calls in either Qwen format); never raises.

    A trailing `<|im_end|>` / `<|endoftext|>` is ignored so that decoded sampled tokens can be passed as is.
    """
    errors: list[ToolCallError] = []
    if not isinstance(text, str):
        return ParsedOutput("", None, [], [ToolCallError("bad_input", f"expected text, got {type(text).__name__}", repr(text)[:200])])
    for end in ("<|im_end|>", "<|endoftext|>"):
        if text.endswith(end):
            text = text[: -len(end)]
            break
    reasoning, rest = _split_reasoning(text, errors)
    content_parts: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        open_at = rest.find(CALL_OPEN, pos)
        close_at = rest.find(CALL_CLOSE, pos)
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            # A closing tag with no opening one: report it and keep the text around it as content.
            content_parts.append(rest[pos:close_at])
            errors.append(ToolCallError("unmatched_close", "</tool_call> without a matching <tool_call>", CALL_CLOSE))
            pos = close_at + len(CALL_CLOSE)
            continue
        if open_at == -1:
            content_parts.append(rest[pos:])
            break
        content_parts.append(rest[pos:open_at])
        body_start = open_at + len(CALL_OPEN)
        close_at = rest.find(CALL_CLOSE, body_start)
        nested = rest.find(CALL_OPEN, body_start)
        if close_at == -1 or (nested != -1 and nested < close_at):
            # Unclosed (output cut off, or a new call opened first): the call is lost, parsing goes on after it.
            stop = len(rest) if nested == -1 else nested
            errors.append(ToolCallError("unclosed_tag", "<tool_call> is never closed by </tool_call>", rest[open_at:stop]))
            pos = stop
            continue
        body = rest[body_start:close_at]
        call = _parse_call_body(body, errors)
        if call is not None:
            calls.append(call)
        pos = close_at + len(CALL_CLOSE)
    return ParsedOutput(content="".join(content_parts).strip(), reasoning=reasoning, calls=calls, errors=errors)


def _split_reasoning(text: str, errors: list[ToolCallError]) -> tuple[str | None, str]:
    """(reasoning or None, the rest). Reasoning is inside <think>..</think> or before a lone </think>."""
    close_at = text.find(THINK_CLOSE)
    if close_at != -1:
        head = text[:close_at]
        open_at = head.find(THINK_OPEN)
        if open_at != -1:
            pre = head[:open_at]
            head = head[open_at + len(THINK_OPEN) :]
        else:
            pre = ""  # the generation prompt already held <think> (or the model skipped it)
        return head.strip("\n"), pre + text[close_at + len(THINK_CLOSE) :]
    open_at = text.find(THINK_OPEN)
    if open_at != -1:
        errors.append(ToolCallError("unclosed_think", "<think> is never closed by </think>", text[open_at:][:2000]))
        return text[open_at + len(THINK_OPEN) :].strip("\n"), text[:open_at]
    return None, text


def _parse_call_body(body: str, errors: list[ToolCallError]) -> ToolCall | None:
    stripped = body.strip()
    raw = CALL_OPEN + body + CALL_CLOSE
    if not stripped:
        errors.append(ToolCallError("empty_call", "<tool_call> block is empty", raw))
        return None
    if stripped.startswith("<function="):
        return _parse_xml_call(stripped, raw, errors)
    return _parse_json_call(stripped, raw, errors)


class _Unrepresentable(ValueError):
    """JSON that Python reads but no trajectory can hold: NaN/Infinity, a number that overflows, a lone surrogate."""


def _no_constant(name: str) -> Any:
    raise _Unrepresentable(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unrepresentable(f"the number {text[:40]} is out of range")
    return value


def _check_text(obj: Any) -> None:
    """Raise on a lone UTF-16 surrogate anywhere in `obj` (from a \\ud800 escape): it cannot be written as UTF-8."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if _SURROGATE.search(x):
                raise _Unrepresentable("a string holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)")
        elif isinstance(x, dict):
            stack += list(x.keys()) + list(x.values())
        elif isinstance(x, list):
            stack += x


def strict_json(text: str) -> Any:
    """`json.loads` that refuses what a Trajectory cannot keep (non-finite numbers, lone surrogates)."""
    obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    _check_text(obj)
    return obj


def _parse_json_call(body: str, raw: str, errors: list[ToolCallError]) -> ToolCall | None:
    try:
        obj = strict_json(body)
    except (json.JSONDecodeError, RecursionError, _Unrepresentable) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else ("nesting too deep" if isinstance(e, RecursionError) else str(e))
        errors.append(ToolCallError("bad_json", f"tool call is not valid JSON: {msg}", raw))
        return None
    if not isinstance(obj, dict):
        errors.append(ToolCallError("not_an_object", f"tool call JSON is a {type(obj).__name__}, not an object", raw))
        return None
    name = obj.get("name")
    if name is None:
        errors.append(ToolCallError("missing_name", 'tool call has no "name"', raw))
        return None
    if not isinstance(name, str) or not _NAME_RE.match(name):
        errors.append(ToolCallError("bad_name", f"tool name {name!r} is not a valid function name", raw))
        return None
    if "arguments" not in obj:
        errors.append(ToolCallError("missing_arguments", f'tool call {name!r} has no "arguments"', raw))
        return None
    args = obj["arguments"]
    if isinstance(args, str):
        # OpenAI-style arguments given as a JSON string: accept when it holds an object.
        try:
            args = strict_json(args)
        except (json.JSONDecodeError, RecursionError, _Unrepresentable):
            pass
    if not isinstance(args, dict):
        errors.append(ToolCallError("arguments_not_object", f'"arguments" of {name!r} is not a JSON object', raw))
        return None
    return ToolCall(name=name, arguments=args)


def _parse_xml_call(body: str, raw: str, errors: list[ToolCallError]) -> ToolCall | None:
    m = _FUNCTION_RE.match(body)
    if m is None:
        errors.append(ToolCallError("bad_xml", "malformed <function=...> tag", raw))
        return None
    name = m.group(1).strip()
    if not name:
        errors.append(ToolCallError("missing_name", "<function=> has no name", raw))
        return None
    if not _NAME_RE.match(name):
        errors.append(ToolCallError("bad_name", f"tool name {name!r} is not a valid function name", raw))
        return None
    end = body.rfind("</function>")
    if end == -1:
        errors.append(ToolCallError("unclosed_tag", f"<function={name}> is never closed by </function>", raw))
        return None
    if body[end + len("</function>") :].strip():
        errors.append(ToolCallError("bad_xml", f"text after </function> in the call to {name!r}", raw))
        return None
    inner = body[m.end() : end]
    args: dict[str, Any] = {}
    pos = 0
    while True:
        pm = _PARAM_RE.search(inner, pos)
        if pm is None:
            if inner[pos:].strip():
                errors.append(ToolCallError("bad_xml", f"unexpected text in the call to {name!r}", raw))
                return None
            break
        if inner[pos : pm.start()].strip():
            errors.append(ToolCallError("bad_xml", f"unexpected text in the call to {name!r}", raw))
            return None
        pname = pm.group(1).strip()
        vend = inner.find("</parameter>", pm.end())
        if vend == -1:
            errors.append(ToolCallError("unclosed_tag", f"<parameter={pname}> is never closed by </parameter>", raw))
            return None
        if not pname:
            errors.append(ToolCallError("bad_xml", f"a parameter of {name!r} has no name", raw))
            return None
        if pname in args:
            errors.append(ToolCallError("duplicate_parameter", f"parameter {pname!r} of {name!r} given twice", raw))
            return None
        args[pname] = _decode_xml_value(inner[pm.end() : vend])
        pos = vend + len("</parameter>")
    return ToolCall(name=name, arguments=args)


def _decode_xml_value(value: str) -> Any:
    # The templates put one newline on each side of a value; only those are layout.
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    try:
        return strict_json(value)
    except (json.JSONDecodeError, RecursionError, _Unrepresentable):
        return value  # text (NaN, 1e999 and unpaired escapes stay the text they are)


def format_tool_call(name: str, arguments: dict[str, Any], style: Literal["json", "xml"] = "json") -> str:
    """The `<tool_call>` block for one call, exactly as the Qwen chat templates render it.

    `json`: Qwen3 form (byte-identical to the Qwen3 template's rendering of a tool call).
    `xml`: Qwen3.5 / Qwen3-Coder form; strings that would read back as another JSON value (or that contain a
    closing tag) are written JSON-encoded so that `parse_tool_calls` round-trips exactly.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"tool name {name!r} is not a valid function name (letters, digits, _ . -)")
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments of {name!r} must be a dict, got {type(arguments).__name__}")
    if style == "json":
        # Same spacing as the template: json.dumps defaults, non-ASCII kept.
        return CALL_OPEN + '\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments, ensure_ascii=False) + "}\n" + CALL_CLOSE
    if style == "xml":
        parts = [CALL_OPEN, "\n<function=", name, ">\n"]
        for key, value in arguments.items():
            if not isinstance(key, str) or not key.strip() or key != key.strip() or any(c in key for c in "<>\n"):
                raise ValueError(f"parameter name {key!r} of {name!r} cannot be written in the XML tool-call form")
            parts += ["<parameter=", key, ">\n", _encode_xml_value(value), "\n</parameter>\n"]
        parts += ["</function>\n", CALL_CLOSE]
        return "".join(parts)
    raise ValueError(f"unknown tool-call style {style!r} (expected 'json' or 'xml')")


def _encode_xml_value(value: Any) -> str:
    if isinstance(value, str):
        risky = any(t in value for t in ("</parameter>", "</function>", CALL_CLOSE, CALL_OPEN, "<parameter=", "<think>", "</think>"))
        if not risky:
            try:
                json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                return value  # plain text reads back as itself
        # Escape '<' so no tag can appear inside the value; JSON decoding restores it.
        return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
