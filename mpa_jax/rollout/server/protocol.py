"""Request validation for `mpa serve`: JSON bodies -> typed requests, or one RequestError naming the field.

Plain functions, testable without HTTP. Every number is checked for type, finiteness and range; every
option the server does not implement is refused (400) unless it is given its neutral value, never
silently ignored.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

from mpa_jax.rollout.server.render import ToolChoice
from mpa_jax.rollout.types import SamplingParams

DEFAULT_MAX_NEW_TOKENS = 128
MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_STOP = 4  # stop strings per request (OpenAI's limit)


class RequestError(ValueError):
    """A bad request: `field` names the offending JSON field; `status` is the HTTP status (400, or 404 for
    an unknown model)."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


def _show(value: Any) -> str:
    try:
        return json.dumps(value)[:40]
    except (TypeError, ValueError):
        return repr(value)[:40]


def as_int(value: Any, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi] or RequestError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(field, f"expected an integer, got {_show(value)}")
    if lo is not None and value < lo:
        raise RequestError(field, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise RequestError(field, f"must be <= {hi}, got {value}")
    return value


def as_float(value: Any, field: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] with lo_open) or RequestError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(field, f"expected a number, got {_show(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise RequestError(field, f"must be a finite number, got {value}")
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise RequestError(field, f"must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and x > hi:
        raise RequestError(field, f"must be <= {hi}, got {value}")
    return x


def as_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(field, f"expected true or false, got {_show(value)}")
    return value


# ---- SGLang-native /generate ----------------------------------------------------------------------

_SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "sampling_seed", "seed",
    "skip_special_tokens", "no_stop_trim", "ignore_eos", "min_new_tokens", "stop", "n",
    "spaces_between_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p",
}
_NEUTRAL = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0, "min_new_tokens": 0, "n": 1}


def parse_sampling(obj: Any, field: str, default_stop: Sequence[int]) -> tuple[SamplingParams, int | None]:
    """SGLang `sampling_params` object -> (SamplingParams, seed or None); unsupported knobs are rejected."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise RequestError(field, "expected an object")
    for key in obj:
        if key not in _SAMPLING_KEYS:
            raise RequestError(f"{field}.{key}", "unknown sampling parameter")
    for key, neutral in _NEUTRAL.items():
        if key in obj and obj[key] != neutral:
            raise RequestError(f"{field}.{key}", f"not supported by this server (only {neutral})")
    if obj.get("stop"):
        raise RequestError(f"{field}.stop", "stop strings are not supported here; use stop_token_ids (or the OpenAI endpoints)")
    if obj.get("ignore_eos"):
        raise RequestError(f"{field}.ignore_eos", "not supported; pass stop_token_ids explicitly")
    for key in ("skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"):
        if key in obj:
            as_bool(obj[key], f"{field}.{key}")
    kw: dict[str, Any] = {}
    kw["max_new_tokens"] = as_int(obj.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), f"{field}.max_new_tokens", 1)
    if "temperature" in obj:
        kw["temperature"] = as_float(obj["temperature"], f"{field}.temperature", 0.0, 100.0)
    if "top_p" in obj:
        kw["top_p"] = as_float(obj["top_p"], f"{field}.top_p", 0.0, 1.0, lo_open=True)
    if "top_k" in obj:
        kw["top_k"] = as_int(obj["top_k"], f"{field}.top_k")
    stops = obj.get("stop_token_ids", list(default_stop))
    if not isinstance(stops, list):
        raise RequestError(f"{field}.stop_token_ids", "expected a list of token ids")
    kw["stop_token_ids"] = tuple(as_int(t, f"{field}.stop_token_ids", 0) for t in stops)
    seed = obj.get("sampling_seed", obj.get("seed"))
    if seed is not None:
        seed = as_int(seed, f"{field}.sampling_seed", 0, 2**63 - 1)
    return SamplingParams(**kw), seed


def prompt_list(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], bool]:
    """/generate `input_ids` / `text` -> (prompts, was_batch)."""
    if "input_ids" in body and body["input_ids"] is not None:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise RequestError("input_ids", "expected a non-empty list of token ids (or a list of such lists)")
        batch = isinstance(ids[0], list)
        rows = ids if batch else [ids]
        out = []
        for i, row in enumerate(rows):
            where = f"input_ids[{i}]" if batch else "input_ids"
            if not isinstance(row, list) or not row:
                raise RequestError(where, "expected a non-empty list of token ids")
            out.append([as_int(t, where, 0) for t in row])
        return out, batch
    if "text" in body and body["text"] is not None:
        if tokenizer is None:
            raise RequestError("text", "this server has no tokenizer; send input_ids")
        text = body["text"]
        batch = isinstance(text, list)
        rows = text if batch else [text]
        if not rows or not all(isinstance(t, str) and t for t in rows):
            raise RequestError("text", "expected a non-empty string or list of strings")
        return [tokenizer.encode(t) for t in rows], batch
    raise RequestError("input_ids", "required (or text)")


# ---- OpenAI /v1/chat/completions and /v1/completions ----------------------------------------------


@dataclasses.dataclass
class OpenAIRequest:
    """What the OpenAI endpoints need after validation (chat and completions alike)."""

    prompts: list[list[int]]  # one per prompt (completions may carry several); n choices each
    params: SamplingParams
    n: int
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: off; else the number of top log-probs per token (0 = only the token's)
    model: str
    tools: list[dict[str, Any]] | None = None
    echo: bool = False
    tool_choice: ToolChoice = dataclasses.field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


# Options accepted only at their neutral value (anything else is a 400 naming them).
_OPENAI_NEUTRAL: dict[str, Any] = {
    "logit_bias": None, "best_of": 1, "suffix": None, "echo": False, "response_format": {"type": "text"},
    "modalities": ["text"], "audio": None, "prediction": None, "web_search_options": None, "functions": None,
    "function_call": None,
}
# Fields real clients send that change nothing a local server does, accepted (type-checked) and ignored
# as vLLM and SGLang do: bookkeeping (metadata, store, user, service_tier, prompt caching, safety id),
# hints for hosted reasoning models (reasoning_effort, verbosity), and the repetition penalties, which
# the engine's sampler does not implement (docs/serving.md says so).
_IGNORED: dict[str, tuple[type, ...]] = {
    "metadata": (dict,), "store": (bool,), "user": (str,), "service_tier": (str,), "reasoning_effort": (str,),
    "verbosity": (str,), "prompt_cache_key": (str,), "prompt_cache_retention": (str,), "prompt_cache_options": (dict,),
    "safety_identifier": (str,), "frequency_penalty": (int, float), "presence_penalty": (int, float),
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop", "seed",
           "logprobs", *_OPENAI_NEUTRAL, *_IGNORED}
_CHAT_KEYS = _COMMON | {"messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "max_completion_tokens",
                        "chat_template_kwargs"}
_COMPLETION_KEYS = _COMMON | {"prompt"}


def _neutral(body: dict[str, Any], allowed: set[str]) -> None:
    for key, value in body.items():
        if key not in allowed:
            raise RequestError(key, "not supported by this server")
    for key, types in _IGNORED.items():
        value = body.get(key)
        if value is None:
            continue
        if key in ("frequency_penalty", "presence_penalty"):
            as_float(value, key, -2.0, 2.0)
        elif isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise RequestError(key, f"expected {' or '.join(t.__name__ for t in types)}, got {_show(value)}")
    for key, neutral in _OPENAI_NEUTRAL.items():
        value = body.get(key)
        if value is None or value == neutral or (key == "logit_bias" and value == {}):
            continue
        raise RequestError(key, f"not supported by this server (only {json.dumps(neutral)})")


def _sampling(body: dict[str, Any], max_tokens_default: int, stop_ids: Sequence[int]) -> tuple[SamplingParams, int, int | None, list[str]]:
    n = as_int(body.get("n", 1) if body.get("n") is not None else 1, "n", 1, MAX_N)
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_new = body.get(max_key)
    kw: dict[str, Any] = {
        "max_new_tokens": as_int(max_new, max_key, 1) if max_new is not None else max_tokens_default,
        "stop_token_ids": tuple(stop_ids),
    }
    if body.get("temperature") is not None:
        kw["temperature"] = as_float(body["temperature"], "temperature", 0.0, 2.0)
    if body.get("top_p") is not None:
        kw["top_p"] = as_float(body["top_p"], "top_p", 0.0, 1.0, lo_open=True)
    if body.get("top_k") is not None:
        kw["top_k"] = as_int(body["top_k"], "top_k", -1)
    seed = as_int(body["seed"], "seed", 0, 2**63 - 1) if body.get("seed") is not None else None
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise RequestError("stop", "expected a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise RequestError("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise RequestError("stop", "stop strings must not be empty")
    return SamplingParams(**kw), n, seed, stops


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = as_bool(body["stream"], "stream") if body.get("stream") is not None else False
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise RequestError("stream_options", "only allowed with stream=true")
        if not isinstance(opts, dict) or any(k not in ("include_usage", "continuous_usage_stats", "include_obfuscation") for k in opts):
            raise RequestError("stream_options", "only {\"include_usage\": bool} is supported")
        include_usage = as_bool(opts.get("include_usage", False), "stream_options.include_usage")
    return stream, include_usage


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    """`tool_choice`: "auto" | "none" | "required" | {"type": "function", "function": {"name": N}} (N offered)."""
    if raw is None or raw == "auto":
        return ToolChoice("auto")
    if raw == "none":
        return ToolChoice("none")
    if raw == "required":
        if not tools:
            raise RequestError("tool_choice", "'required' needs tools")
        return ToolChoice("required")
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        offered = [t["function"]["name"] for t in tools or []]
        if not isinstance(name, str) or name not in offered:
            raise RequestError("tool_choice", f"function {_show(name)} is not among the tools offered ({', '.join(offered) or 'none'})")
        return ToolChoice("function", name)
    raise RequestError("tool_choice", "expected 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}")


def parse_chat_request(body: dict[str, Any], tokenizer: Any, default_max_new_tokens: int, stop_ids: Sequence[int],
                       served_model: str) -> tuple[OpenAIRequest, list[dict[str, Any]]]:
    """Validate a chat completion body; returns the request (prompt not yet rendered) and the messages."""
    _neutral(body, _CHAT_KEYS)
    model = _model(body, served_model)
    messages = chat_messages(body.get("messages"))
    tools = chat_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    if choice.mode == "none":
        tools = None
    parallel = as_bool(body["parallel_tool_calls"], "parallel_tool_calls") if body.get("parallel_tool_calls") is not None else True
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict) or any(not isinstance(k, str) for k in template_kwargs):
        raise RequestError("chat_template_kwargs", "expected an object (e.g. {\"enable_thinking\": false})")
    params, n, seed, stops = _sampling(body, default_max_new_tokens, stop_ids)
    stream, include_usage = _stream_flags(body)
    logprobs: int | None = None
    if body.get("logprobs") is not None and as_bool(body["logprobs"], "logprobs"):
        logprobs = 0
    if body.get("top_logprobs") is not None:
        top = as_int(body["top_logprobs"], "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if logprobs is None:
            raise RequestError("top_logprobs", "requires logprobs=true")
        logprobs = top
    return OpenAIRequest([], params, n, seed, stops, stream, include_usage, logprobs, model, tools, False, choice,
                         parallel, dict(template_kwargs)), messages


def parse_completion_request(body: dict[str, Any], tokenizer: Any, stop_ids: Sequence[int],
                             served_model: str) -> OpenAIRequest:
    """Validate a (legacy) completion body; prompts are a string, strings, token ids or lists of ids."""
    _neutral(body, _COMPLETION_KEYS)
    model = _model(body, served_model)
    raw = body.get("prompt")
    if isinstance(raw, str):
        rows: list[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        rows = [raw]
    elif isinstance(raw, list) and raw:
        rows = raw
    else:
        raise RequestError("prompt", "required: a string, a list of strings, a list of token ids or a list of such lists")
    prompts = []
    for i, r in enumerate(rows):
        where = f"prompt[{i}]" if len(rows) > 1 else "prompt"
        if isinstance(r, str):
            if not r:
                raise RequestError(where, "must not be empty")
            prompts.append(tokenizer.encode(r))
        elif isinstance(r, list) and r:
            prompts.append([as_int(t, where, 0) for t in r])
        else:
            raise RequestError(where, "expected a non-empty string or list of token ids")
    params, n, seed, stops = _sampling(body, 16, stop_ids)  # OpenAI's completions default: 16 tokens
    stream, include_usage = _stream_flags(body)
    logprobs = None
    if body.get("logprobs") is not None:
        logprobs = as_int(body["logprobs"], "logprobs", 0, 5)
    return OpenAIRequest(prompts, params, n, seed, stops, stream, include_usage, logprobs, model)


def _model(body: dict[str, Any], served: str) -> str:
    """The served model's name; a request naming another model is a 404 (as vLLM and SGLang answer)."""
    model = body.get("model")
    if model is None or model == "":
        return served
    if not isinstance(model, str):
        raise RequestError("model", "expected a string")
    if model != served:
        raise RequestError("model", f"model {_show(model)} not found; this server serves {_show(served)}", status=404)
    return model


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the template's form (tool-call arguments decoded from JSON strings)."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages", "required: a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(where, "expected an object")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for system
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role", f"must be system, developer, user, assistant or tool, got {role!r}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"{where}.content[{j}]", "only text content parts are supported")
                parts.append(part["text"])
            content = "".join(parts)
        if content is not None and not isinstance(content, str):
            raise RequestError(f"{where}.content", "expected a string")
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        if isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise RequestError(f"{where}.tool_calls", "expected a list")
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(f"{where}.tool_calls[{j}].function.name", "required")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise RequestError(f"{where}.tool_calls[{j}].function.arguments", "not valid JSON") from None
                if not isinstance(args, dict):
                    raise RequestError(f"{where}.tool_calls[{j}].function.arguments", "must be a JSON object")
                calls.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def chat_tools(raw: Any) -> list[dict[str, Any]] | None:
    """OpenAI `tools` (function tools only) or RequestError."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools", "expected a list of function tools")
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(f"tools[{i}]", "expected {\"type\": \"function\", \"function\": {...}}")
        if not isinstance(t["function"].get("name"), str):
            raise RequestError(f"tools[{i}].function.name", "required")
    return raw or None
