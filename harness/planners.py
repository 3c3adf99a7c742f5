"""Planner backends behind one interface: `respond(messages, tools) -> PlannerReply`.

- `EnginePlanner`: any object with the RolloutEngine shape (`generate(prompts, params, seeds)`) and a
  tokenizer: the embedded JAX engine or the SGLang client (token-in/token-out: the reply keeps its
  sampled ids and log-probs). Duck-typed, so this module never imports jax or the rollout package.
- `OpenAIChatPlanner`: any OpenAI-compatible `/v1/chat/completions` endpoint with `tools` and
  `tool_calls` (`mpa serve`, SGLang's OpenAI server, vLLM, hosted APIs).
- `ScriptedPlanner`: replays given replies (tests, demos).

Nothing here raises for a backend problem: timeouts, HTTP errors, engine errors and garbage replies
come back as a PlannerReply whose `error` is a Feedback (TIMEOUT/INFRA for the backend's fault,
INVALID_ARGUMENTS for an unparseable tool call), so the episode loop goes on or ends cleanly.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Protocol, Sequence

from mpa_jax.envs.contract import ErrorCode, Feedback
from mpa_jax.harness.episode import PARSE_HINT


@dataclasses.dataclass
class PlannerReply:
    """One planner turn: text and/or tool calls ({"name", "arguments", "id"}), or an error Feedback."""

    text: str = ""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reasoning: str | None = None
    error: Feedback | None = None
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    raw: str = ""

    @property
    def infra(self) -> bool:
        return self.error is not None and self.error.is_infra

    def to_message(self) -> dict[str, Any]:
        """The assistant message of this reply (OpenAI style)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [{"type": "function", "id": c.get("id", ""),
                                  "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in self.calls]
        return msg


class Planner(Protocol):
    name: str

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        ...


def _from_text(text: str, raw: str | None = None) -> PlannerReply:
    """Parse model text (Qwen `<tool_call>` JSON or XML) into a reply; a malformed call is a parse error."""
    from mpa_jax.tokenizer.toolcall import parse_tool_calls

    parsed = parse_tool_calls(text)
    reply = PlannerReply(text=parsed.content or "", reasoning=parsed.reasoning, raw=raw if raw is not None else text)
    if parsed.errors:
        err = parsed.errors[0]
        reply.error = Feedback.error(ErrorCode.INVALID_ARGUMENTS,
                                     f"Your tool call could not be parsed ({err.kind}): {err.message}", hint=PARSE_HINT)
        return reply
    reply.calls = [{"name": c.name, "arguments": dict(c.arguments)} for c in parsed.calls]
    return reply


class ScriptedPlanner:
    """Replays replies: model text strings (parsed like model output) or `PlannerReply` objects, or a
    function `(messages, tools, turn) -> text | PlannerReply`."""

    name = "scripted"

    def __init__(self, script: Sequence[Any] | Callable[[list[dict[str, Any]], Any, int], Any]) -> None:
        self.script = script
        self.turn = 0
        self.seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        self.seen.append(([dict(m) for m in messages], tools))
        if callable(self.script):
            item = self.script(messages, tools, self.turn)
        else:
            item = self.script[min(self.turn, len(self.script) - 1)]
        self.turn += 1
        if isinstance(item, PlannerReply):
            return item
        return _from_text(str(item))


class EnginePlanner:
    """A RolloutEngine-shaped object plus a tokenizer (chat template + Qwen tool-call format)."""

    name = "engine"

    def __init__(self, engine: Any, tokenizer: Any, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int = 0, *, params_cls: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self._params_cls = params_cls
        self._n = 0

    def _params(self) -> Any:
        cls = self._params_cls  # the engine's SamplingParams, passed in: the harness never imports the rollout package
        stops = [self.tokenizer.token_id("<|im_end|>"), *getattr(self.tokenizer, "eos_token_ids", [])]
        return cls(max_new_tokens=self.max_new_tokens, temperature=self.temperature, stop_token_ids=tuple(dict.fromkeys(stops)))

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        from mpa_jax import tokenizer as tk

        t0 = time.perf_counter()
        try:
            prompt = tk.generation_prompt_ids(self.tokenizer, messages, tools)
            self._n += 1
            (out,) = self.engine.generate([prompt], self._params(), [self.seed * 1_000_003 + self._n])
        except Exception as e:  # noqa: BLE001 - EngineError or a broken backend: the world's fault
            return PlannerReply(error=Feedback.error(ErrorCode.INFRA, f"planner engine failed: {type(e).__name__}: {e}"),
                                latency_s=time.perf_counter() - t0)
        if getattr(out, "finish_reason", "") == "abort":
            return PlannerReply(error=Feedback.error(ErrorCode.INFRA, f"planner engine aborted: {getattr(out, 'error', '')}"),
                                latency_s=time.perf_counter() - t0)
        text = self.tokenizer.decode(list(out.token_ids))
        for end in ("<|im_end|>", "<|endoftext|>"):
            if text.endswith(end):
                text = text[: -len(end)]
        reply = _from_text(text)
        reply.prompt_ids, reply.token_ids, reply.logprobs = list(prompt), list(out.token_ids), list(out.logprobs)
        reply.prompt_tokens, reply.output_tokens = len(prompt), len(out.token_ids)
        reply.latency_s = time.perf_counter() - t0
        return reply


class OpenAIChatPlanner:
    """Any OpenAI-compatible chat endpoint (`base_url` ends before `/chat/completions`, e.g. http://h:p/v1)."""

    name = "openai"

    def __init__(self, base_url: str, model: str = "", timeout_s: float = 60.0, max_tokens: int = 256,
                 temperature: float = 0.0, api_key: str = "", retries: int = 1) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.timeout_s, self.max_tokens, self.temperature = model, timeout_s, max_tokens, temperature
        self.api_key, self.retries = api_key, retries

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        import httpx

        body: dict[str, Any] = {"messages": _openai_messages(messages), "max_tokens": self.max_tokens,
                                "temperature": self.temperature}
        if self.model:  # "": the server's own model (servers answer 404 to a model they do not serve)
            body["model"] = self.model
        if tools:
            body["tools"] = tools
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.base_url + "/chat/completions"
        t0 = time.perf_counter()
        last = ""
        for attempt in range(self.retries + 1):
            try:
                r = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.TimeoutException:
                last = "timeout"
                err = Feedback.error(ErrorCode.TIMEOUT, f"planner endpoint {url} did not answer within {self.timeout_s:g} s")
                continue
            except httpx.HTTPError as e:
                last = "http"
                err = Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} unreachable: {type(e).__name__}: {e}")
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = "http"
                err = Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} answered HTTP {r.status_code}: {r.text[:200]}")
                continue
            if r.status_code != 200:
                return PlannerReply(error=Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} refused the request: HTTP {r.status_code}: {r.text[:200]}"),
                                    latency_s=time.perf_counter() - t0)
            return _parse_openai(r, url, time.perf_counter() - t0)
        del last
        return PlannerReply(error=err, latency_s=time.perf_counter() - t0)


def _parse_openai(r: Any, url: str, latency: float) -> PlannerReply:
    try:
        data = r.json()
        choice = data["choices"][0]
        msg = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return PlannerReply(error=Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} sent a reply that is not an OpenAI chat completion: {r.text[:200]!r}"),
                            latency_s=latency, raw=r.text[:2000])
    usage = data.get("usage") or {}
    content = msg.get("content") or ""
    if not msg.get("tool_calls") and "<tool_call>" in content:
        # A server that could not parse the model's call returns it verbatim (SGLang, `mpa serve`).
        reply = _from_text(content)
        reply.latency_s = latency
        reply.prompt_tokens = int(usage.get("prompt_tokens", 0) or 0)
        reply.output_tokens = int(usage.get("completion_tokens", 0) or 0)
        return reply
    reply = PlannerReply(text=msg.get("content") or "", reasoning=msg.get("reasoning_content"), latency_s=latency,
                         prompt_tokens=int(usage.get("prompt_tokens", 0) or 0), output_tokens=int(usage.get("completion_tokens", 0) or 0),
                         raw=json.dumps(msg)[:4000])
    for i, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                reply.error = Feedback.error(ErrorCode.INVALID_ARGUMENTS,
                                             f"Your tool call could not be parsed (arguments): not JSON ({e.msg})", hint=PARSE_HINT)
                return reply
        if not isinstance(fn.get("name"), str) or not isinstance(args, dict):
            reply.error = Feedback.error(ErrorCode.INVALID_ARGUMENTS, "Your tool call could not be parsed: it needs a name and an object of arguments",
                                         hint=PARSE_HINT)
            return reply
        reply.calls.append({"name": fn["name"], "arguments": args, "id": call.get("id", f"call_{i}")})
    return reply


def _openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wants tool-call arguments as JSON strings."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                fn = c.setdefault("function", {})
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments", {}))
                c.setdefault("type", "function")
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out
