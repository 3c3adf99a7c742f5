"""OpenAI response shapes for `mpa serve`: stop strings, log-probs, chat and completion choices, and
their server-sent-event chunks (`chat.completion.chunk` / `text_completion`, then `data: [DONE]`).

Text is built token by token (`token_pieces`) so that stop strings, log-probs and streamed deltas all
agree on which tokens a choice holds: the concatenated deltas of a stream equal the non-streamed text.
Streams are incremental: `chat_events` / `completion_events` send deltas as the batcher's `RowStream`
delivers tokens (`ChoiceStream` decides what is safe to send before a choice ends).
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator, Iterator

from mpa_jax.rollout.types import GenerateResult

END_STRINGS = ("<|im_end|>", "<|endoftext|>")


def token_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Text added by each token, so that `"".join(pieces) == tokenizer.decode(ids)`.

    A token that ends inside a multi-byte UTF-8 character adds "" and the character comes with the
    token that completes it (a byte-level tokenizer decodes a partial character as U+FFFD).

    Linear time: each token's own text is its piece (one backend call for all), except in runs of
    tokens that hold partial characters, which are decoded together from the run's start; the result
    is checked against the whole decode, and only a decoder that fails the check gets every prefix
    decoded (quadratic in length).
    """
    if not ids:
        return []
    full = tokenizer.decode(ids)
    each = getattr(tokenizer, "decode_each", None)
    singles = each(ids) if each is not None else [tokenizer.decode([t]) for t in ids]
    fast: list[str] = []
    start = -1  # first token of the pending run, -1: none
    for k, single in enumerate(singles):
        if start < 0 and "\ufffd" not in single:
            fast.append(single)
            continue
        start = k if start < 0 else start
        text = tokenizer.decode(ids[start: k + 1])
        if text.endswith("\ufffd") and k < len(ids) - 1:
            fast.append("")
            continue
        fast.append(text)
        start = -1
    if "".join(fast) == full:
        return fast
    pieces: list[str] = []
    done = ""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        if (k < len(ids) and text.endswith("\ufffd")) or not text.startswith(done):
            pieces.append("")
            continue
        pieces.append(text[len(done):])
        done = text
    if pieces and "".join(pieces) != tokenizer.decode(ids):  # a decoder that rewrites earlier text
        full = tokenizer.decode(ids)
        return [full] + [""] * (len(ids) - 1)
    return pieces


@dataclasses.dataclass
class Output:
    """One choice's generated text and the tokens behind it (stop token and text after a stop string cut)."""

    text: str
    ids: list[int]
    pieces: list[str]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    finish_reason: str  # stop | length
    completion_tokens: int  # every token generated, for usage


def shape_output(tokenizer: Any, result: GenerateResult, stops: list[str]) -> Output:
    """The text of `result` without its stop token, cut at the earliest stop string (OpenAI semantics:
    the stop string itself is not returned)."""
    ids = list(result.token_ids)
    n = len(ids) - 1 if result.finish_reason == "stop" and ids else len(ids)
    pieces = token_pieces(tokenizer, ids[:n])
    text = "".join(pieces)
    finish = "stop" if result.finish_reason == "stop" else "length"
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut >= 0:
        finish = "stop"
        kept, pos = [], 0
        for p in pieces:
            if pos >= cut:
                break
            kept.append(p[: cut - pos])
            pos += len(p)
        pieces, text, n = kept, text[:cut], len(kept)
    top = result.top_logprobs[:n] if result.top_logprobs is not None else None
    return Output(text, ids[:n], pieces, list(result.logprobs[:n]), top, finish, len(ids))


def _token_entry(tokenizer: Any, tid: int, lp: float) -> dict[str, Any]:
    s = tokenizer.decode([tid])
    return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}


def chat_logprobs(tokenizer: Any, out: Output, top_n: int, lo: int = 0, hi: int | None = None) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat completion for tokens [lo, hi) of the output."""
    hi = len(out.ids) if hi is None else hi
    content = []
    for k in range(lo, hi):
        entry = _token_entry(tokenizer, out.ids[k], out.logprobs[k])
        tops = out.top[k][:top_n] if out.top is not None else []
        entry["top_logprobs"] = [_token_entry(tokenizer, t, v) for t, v in tops]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer: Any, out: Output, top_n: int, lo: int = 0, hi: int | None = None,
                        offset: int = 0) -> dict[str, Any]:
    """`choices[i].logprobs` of a (legacy) completion for tokens [lo, hi)."""
    hi = len(out.ids) if hi is None else hi
    tokens, offsets, tops = [], [], []
    pos = offset + sum(len(p) for p in out.pieces[:lo])
    for k in range(lo, hi):
        tokens.append(tokenizer.decode([out.ids[k]]))
        offsets.append(pos)
        pos += len(out.pieces[k])
        if top_n and out.top is not None:
            tops.append({tokenizer.decode([t]): v for t, v in out.top[k][:top_n]})
        else:
            tops.append(None)
    return {"tokens": tokens, "token_logprobs": out.logprobs[lo:hi], "top_logprobs": tops, "text_offset": offsets}


def offered_names(tools: Any) -> set[str]:
    """Names of the function tools a request offers."""
    return {t["function"]["name"] for t in tools or []}


def _call_dict(c: Any) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}


def _without_reasoning(text: str) -> str:
    """`text` with its `<think>...</think>` block (or the part before a lone `</think>`) removed, stripped."""
    from mpa_jax.tokenizer.toolcall import THINK_CLOSE, THINK_OPEN

    close = text.find(THINK_CLOSE)
    if close >= 0:
        open_ = text.find(THINK_OPEN, 0, close)
        return ((text[:open_] if open_ >= 0 else "") + text[close + len(THINK_CLOSE):]).strip()
    return text.strip()


def chat_message(tokenizer: Any, out: Output, tools: Any, prefix: str = "", parallel: bool = True) -> tuple[dict[str, Any], str]:
    """(assistant message, finish_reason) of one choice; `prefix` is the forced opening of the turn
    (prepended before parsing).

    Reasoning (`<think>...</think>`) goes to `reasoning_content` (omitted when empty), never into
    `content`. Tool calls become `tool_calls` only when tools were offered, the text parses cleanly and
    every call names an offered tool; otherwise the text (without its reasoning) is the content, as
    SGLang and vLLM answer when their tool parser fails. `parallel=False` keeps the first call.
    """
    from mpa_jax import tokenizer as tk

    text = prefix + out.text
    parsed = tk.parse_tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    finish = out.finish_reason
    names = offered_names(tools)
    if parsed.calls and not parsed.errors and all(c.name in names for c in parsed.calls):
        calls = parsed.calls if parallel else parsed.calls[:1]
        message["tool_calls"] = [_call_dict(c) for c in calls]
        finish = "tool_calls"
    elif parsed.errors or parsed.calls:
        message["content"] = _without_reasoning(text) or None  # what the model wrote, as SGLang does
    return message, finish


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI `usage`; `cached_tokens`: prompt tokens the engine reused from its prefix cache (the prompt
    counted once: for n choices of one prompt, the most any choice reused)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": min(int(cached_tokens), prompt_tokens)}}


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _content_so_far(text: str) -> str:
    """The part of a chat choice's text that is content for sure so far: reasoning removed (an open
    `<think>` holds everything after it), cut at the first `<` (a tag may start there), stripped."""
    from mpa_jax.tokenizer.toolcall import THINK_CLOSE, THINK_OPEN

    close = text.find(THINK_CLOSE)
    if close >= 0:
        open_ = text.find(THINK_OPEN, 0, close)
        text = (text[:open_] if open_ >= 0 else "") + text[close + len(THINK_CLOSE):]
    lt = text.find("<")
    return (text if lt < 0 else text[:lt]).strip()


class ChoiceStream:
    """One choice decoded incrementally: which content (and log-probs) may be sent so far.

    Text that could still become part of a stop string is held back, and a chat choice streams its
    content only up to the first `<` (a `<think>` or `<tool_call>` tag may start there; what follows
    is sent when the choice ends, parsed as the non-streamed answer is) with whitespace at either end
    held (chat content is stripped). With `tools`, each tool call is sent as soon as its `</tool_call>`
    is decoded (when everything up to it parses cleanly). `rest` sends what is left so that the
    concatenated deltas equal the non-streamed answer. Log-probs go out with the tokens whose text is sent.
    """

    def __init__(self, tokenizer: Any, stops: list[str], chat: bool, top_n: int | None, tools: Any = None,
                 prefix: str = "", parallel: bool = True) -> None:
        self.tokenizer = tokenizer
        self.parallel = parallel
        self.prefix = prefix  # forced opening of the turn: part of the text, not of the generated tokens
        self.stops = [s for s in stops if s]
        self.chat = chat
        self.top_n = top_n
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.ends: list[int] = []  # text length after each token
        self.text = prefix
        self.sent = ""
        self.lp_sent = 0
        self.hit_stop = False  # a stop string is in the text: the producer may stop this choice
        self.tools = tools
        self.calls_sent: list[dict[str, Any]] = []  # tool calls already streamed
        self._closes = 0

    def _output(self) -> Output:
        pieces = [self.text[a:b] for a, b in zip([0] + self.ends[:-1], self.ends)]
        return Output(self.text, self.ids, pieces, self.lps, self.tops if self.tops else None, "length", len(self.ids))

    def feed(self, ids: list[int], lps: list[float], tops: Any) -> tuple[str, Any, list[dict[str, Any]]]:
        """Take new tokens; returns (content delta, log-probs object or None, new tool calls) to send now."""
        if self.hit_stop:
            return "", None, []
        for k, t in enumerate(ids):
            self.ids.append(int(t))
            self.lps.append(float(lps[k]))
            if tops is not None:
                self.tops.append(list(tops[k]))
            text = self.prefix + self.tokenizer.decode(self.ids)
            if not text.endswith("\ufffd") and text.startswith(self.text):  # a partial UTF-8 character waits
                self.text = text
            self.ends.append(len(self.text))
        raw = self.text
        gen = raw[len(self.prefix):]  # stop strings match generated text only
        cut = min((i for i in (gen.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit_stop = True
            return "", None, []
        hold = max((k for s in self.stops for k in range(1, len(s)) if gen.endswith(s[:k])), default=0)
        visible = raw[: len(raw) - hold]
        candidate = visible
        if self.chat:
            candidate = _content_so_far(candidate)
        delta = ""
        if candidate.startswith(self.sent) and len(candidate) > len(self.sent):
            delta = candidate[len(self.sent):]
            self.sent = candidate
        lp = None
        if self.top_n is not None:
            settled = self.lp_sent
            while settled < len(self.ids) and self.ends[settled] <= len(visible):
                settled += 1
            if settled > self.lp_sent:
                lp = self._logprobs(self._output(), self.lp_sent, settled)
                self.lp_sent = settled
        return delta, lp, self._new_calls(visible)

    def _new_calls(self, visible: str) -> list[dict[str, Any]]:
        """Tool calls completed in `visible` since the last update (none unless everything parses)."""
        from mpa_jax import tokenizer as tk
        from mpa_jax.tokenizer.toolcall import CALL_CLOSE

        closes = visible.count(CALL_CLOSE) if self.chat and self.tools else 0
        if closes <= self._closes:
            return []
        self._closes = closes
        parsed = tk.parse_tool_calls(visible[: visible.rfind(CALL_CLOSE) + len(CALL_CLOSE)])
        if parsed.errors or len(parsed.calls) <= len(self.calls_sent):
            return []
        if any(c.name not in offered_names(self.tools) for c in parsed.calls):
            return []  # the final answer will be text (a call to a tool not offered)
        keep = parsed.calls if self.parallel else parsed.calls[:1]
        new = [_call_dict(c) for c in keep[len(self.calls_sent):]]
        if not new:
            return []
        self.calls_sent.extend(new)
        return new

    def rest_calls(self, final: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The final answer's tool calls not streamed yet (the streamed ones are its first ones, unless a
        later part of the text failed to parse: then the answer has none and nothing more is sent)."""
        return final[len(self.calls_sent):]

    def _logprobs(self, out: Output, lo: int, hi: int) -> Any:
        if self.chat:
            return chat_logprobs(self.tokenizer, out, self.top_n or 0, lo, hi)
        return completion_logprobs(self.tokenizer, out, self.top_n or 0, lo, hi)

    def rest(self, out: Output, content: str) -> tuple[str, Any]:
        """The final (content delta, log-probs) once the choice is done: `content` is the whole answer."""
        delta = content[len(self.sent):] if content.startswith(self.sent) else ""
        self.sent = content
        lp = None
        if self.top_n is not None and self.lp_sent < len(out.ids):
            lp = self._logprobs(out, self.lp_sent, len(out.ids))
            self.lp_sent = len(out.ids)
        return delta, lp


async def chat_events(tokenizer: Any, stream: Any, stops: list[str], tools: Any, *, rid: str, model: str,
                      fingerprint: str, top_n: int | None, prompt_tokens: int, include_usage: bool,
                      prefix: str = "", parallel: bool = True) -> AsyncIterator[str]:
    """The `chat.completion.chunk` events of a `RowStream` (one row per choice) as tokens are decoded:
    content deltas, then at each choice's end its reasoning, tool-call deltas and finish reason;
    usage when asked; `[DONE]`. Stops the producer's rows early on a stop string or a closed client."""
    created = int(time.time())
    choices = [ChoiceStream(tokenizer, stops, True, top_n, tools, prefix, parallel) for _ in range(stream.n_rows)]
    total = 0

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    def call_chunks(index: int, first: int, calls: list[dict[str, Any]]) -> Iterator[str]:
        for j, call in enumerate(calls, start=first):
            yield chunk(index, {"tool_calls": [{"index": j, "id": call["id"], "type": "function",
                                                "function": {"name": call["function"]["name"], "arguments": ""}}]})
            yield chunk(index, {"tool_calls": [{"index": j, "function": {"arguments": call["function"]["arguments"]}}]})

    try:
        for i in range(stream.n_rows):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, upd in stream:
            ch = choices[i]
            if upd.result is None:
                before = len(ch.calls_sent)
                delta, lp, calls = ch.feed(upd.token_ids, upd.logprobs, upd.top_logprobs)
                if ch.hit_stop:
                    stream.cancel(i)
                if delta or lp is not None:
                    yield chunk(i, {"content": delta}, logprobs=lp)
                for event in call_chunks(i, before, calls):
                    yield event
                continue
            out = shape_output(tokenizer, upd.result, stops)
            total += out.completion_tokens
            msg, finish = chat_message(tokenizer, out, tools, prefix, parallel)
            if ch.calls_sent and finish != "tool_calls":
                finish = "tool_calls"  # calls already sent stand (a later part of the text did not parse)
            delta, lp = ch.rest(out, msg.get("content") or "")
            if delta or lp is not None:
                yield chunk(i, {"content": delta}, logprobs=lp)
            if msg.get("reasoning_content"):
                yield chunk(i, {"reasoning_content": msg["reasoning_content"]})
            for event in call_chunks(i, len(ch.calls_sent), ch.rest_calls(msg.get("tool_calls") or [])):
                yield event
            yield chunk(i, {}, finish)
    finally:
        stream.cancel_all()  # a client that went away frees its slots
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": fingerprint, "choices": [], "usage": usage(prompt_tokens, total)})
    yield "data: [DONE]\n\n"


async def completion_events(tokenizer: Any, stream: Any, stops: list[str], *, rid: str, model: str, fingerprint: str,
                            top_n: int | None, prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
    """The `text_completion` events of a `RowStream` as tokens are decoded, then `[DONE]`."""
    created = int(time.time())
    choices = [ChoiceStream(tokenizer, stops, False, top_n) for _ in range(stream.n_rows)]
    total = 0

    def chunk(index: int, text: str, finish: str | None, logprobs: Any) -> str:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})

    try:
        async for i, upd in stream:
            ch = choices[i]
            if upd.result is None:
                delta, lp, _ = ch.feed(upd.token_ids, upd.logprobs, upd.top_logprobs)
                if ch.hit_stop:
                    stream.cancel(i)
                if delta or lp is not None:
                    yield chunk(i, delta, None, lp)
                continue
            out = shape_output(tokenizer, upd.result, stops)
            total += out.completion_tokens
            delta, lp = ch.rest(out, out.text)
            if delta or lp is not None:
                yield chunk(i, delta, None, lp)
            yield chunk(i, "", out.finish_reason, None)
    finally:
        stream.cancel_all()
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                   "system_fingerprint": fingerprint, "choices": [], "usage": usage(prompt_tokens, total)})
    yield "data: [DONE]\n\n"


async def collect(tokenizer: Any, stream: Any, stops: list[str]) -> list[GenerateResult]:
    """The final results of a `RowStream`; with stop strings, a row stops as soon as one is decoded."""
    if not stops:
        return await stream.collect()
    watch = [ChoiceStream(tokenizer, stops, False, None) for _ in range(stream.n_rows)]
    try:
        async for i, upd in stream:
            if upd.result is None and not watch[i].hit_stop:
                watch[i].feed(upd.token_ids, upd.logprobs, None)
                if watch[i].hit_stop:
                    stream.cancel(i)
    finally:
        stream.cancel_all()
    return list(stream.results)
