"""Planner backends behind the one planner protocol (`envs.episode.Planner`: `respond(messages, tools) ->
PlannerReply`), all driven by the one chat-level driver (`envs.episode.drive` / `run_chat_episode`).

- `EnginePlanner`: any object with the RolloutEngine shape (`generate(prompts, params, seeds)`) and a
  tokenizer: the embedded JAX engine or the SGLang client (token-in/token-out: the reply keeps its
  sampled ids and log-probs). Duck-typed, so this module never imports jax or the rollout package.
- `OpenAIChatPlanner`: the one OpenAI client (httpx): any OpenAI-compatible `/v1/chat/completions`
  endpoint with `tools` and `tool_calls` (`mpa serve`, SGLang's OpenAI server, vLLM, hosted APIs); the
  teacher endpoint of data collection is one too.
- `ScriptedPlanner`: replays given replies (tests, demos).
- The scripted oracle (`envs.oracle.OraclePlanner`) lives with the envs (the task gate runs it).

Nothing here raises for a backend problem: timeouts, HTTP errors, engine errors and garbage replies
come back as a PlannerReply whose `error` is a Feedback (TIMEOUT/INFRA for the backend's fault,
INVALID_ARGUMENTS for an unparseable tool call), so the episode loop goes on or ends cleanly. Any other
exception (a programming error) is raised: a bug is never infra.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from mpa_jax.envs.contract import ErrorCode, Feedback
from mpa_jax.envs.episode import PARSE_HINT, Planner, PlannerReply  # noqa: F401 - the protocol, importable from here too


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
    """A RolloutEngine-shaped object plus a tokenizer (chat template + Qwen tool-call format). An exception of
    `engine_errors` (the engine's `EngineError`) or an aborted request is an INFRA reply; any other is raised."""

    name = "engine"

    def __init__(self, engine: Any, tokenizer: Any, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int = 0, *, params_cls: Any, engine_errors: tuple[type[BaseException], ...]) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        # the engine's SamplingParams and EngineError, passed in: the harness never imports the rollout package
        self._params_cls, self._engine_errors = params_cls, tuple(engine_errors)
        self._n = 0

    def _params(self) -> Any:
        cls = self._params_cls
        stops = [self.tokenizer.token_id("<|im_end|>"), *getattr(self.tokenizer, "eos_token_ids", [])]
        return cls(max_new_tokens=self.max_new_tokens, temperature=self.temperature, stop_token_ids=tuple(dict.fromkeys(stops)))

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        from mpa_jax import tokenizer as tk

        t0 = time.perf_counter()
        prompt = tk.generation_prompt_ids(self.tokenizer, messages, tools)
        self._n += 1
        try:
            (out,) = self.engine.generate([prompt], self._params(), [self.seed * 1_000_003 + self._n])
        except self._engine_errors as e:  # the engine reports a fault (infra); any other exception is a bug
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
    """Any OpenAI-compatible chat endpoint (`base_url`: e.g. http://h:p/v1 or http://h:p); `model` "" asks
    for the server's own model. Backend faults come back as TIMEOUT/INFRA error replies (see the module
    docstring)."""

    name = "openai"

    def __init__(self, base_url: str, model: str = "", timeout_s: float = 60.0, max_tokens: int = 256,
                 temperature: float = 0.0, api_key: str = "", retries: int = 1) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.timeout_s, self.max_tokens, self.temperature = model, timeout_s, max_tokens, temperature
        self.api_key, self.retries = api_key, retries
        # the endpoint: `<base_url>/chat/completions` for a base that ends in /v1, else `<base_url>/v1/chat/completions`
        self.url = self.base_url + ("/chat/completions" if self.base_url.endswith("/v1") else "/v1/chat/completions")

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        import httpx

        body: dict[str, Any] = {"messages": _openai_messages(messages), "max_tokens": self.max_tokens,
                                "temperature": self.temperature}
        if self.model:  # "": the server's own model (servers answer 404 to a model they do not serve)
            body["model"] = self.model
        if tools:
            body["tools"] = tools
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.url
        t0 = time.perf_counter()
        for _ in range(self.retries + 1):
            try:
                r = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.TimeoutException:
                err = Feedback.error(ErrorCode.TIMEOUT, f"planner endpoint {url} did not answer within {self.timeout_s:g} s")
                continue
            except (httpx.HTTPError, OSError) as e:
                err = Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} unreachable: {type(e).__name__}: {e}")
                continue
            if r.status_code >= 500 or r.status_code == 429:
                err = Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} answered HTTP {r.status_code}: {r.text[:200]}")
                continue
            if r.status_code != 200:
                return PlannerReply(error=Feedback.error(ErrorCode.INFRA, f"planner endpoint {url} refused the request: HTTP {r.status_code}: {r.text[:200]}"),
                                    latency_s=time.perf_counter() - t0)
            return _parse_openai(r, url, time.perf_counter() - t0)
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
