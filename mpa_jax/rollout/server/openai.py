"""OpenAI response shapes for `mpa serve`: stop strings, log-probs, chat and completion choices, and
their server-sent-event chunks (`chat.completion.chunk` / `text_completion`, then `data: [DONE]`).

Text is built token by token (`token_pieces`) so that stop strings, log-probs and streamed deltas all
agree on which tokens a choice holds: the concatenated deltas of a stream equal the non-streamed text.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Iterator

from mpa_jax.rollout.types import GenerateResult

END_STRINGS = ("<|im_end|>", "<|endoftext|>")


def token_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Text added by each token, so that `"".join(pieces) == tokenizer.decode(ids)`.

    A token that ends inside a multi-byte UTF-8 character adds "" and the character comes with the
    token that completes it (a byte-level tokenizer decodes a partial character as U+FFFD).
    """
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


def chat_message(tokenizer: Any, out: Output, tools: Any) -> tuple[dict[str, Any], str]:
    """(assistant message, finish_reason): tool calls parsed when tools were given; unparsable output verbatim."""
    from mpa_jax import tokenizer as tk

    parsed = tk.parse_tool_calls(out.text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    finish = out.finish_reason
    if parsed.calls and tools and not parsed.errors:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in parsed.calls
        ]
        finish = "tool_calls"
    elif parsed.errors or (parsed.calls and not tools):
        message = {"role": "assistant", "content": out.text}  # what the model wrote, as SGLang does
    return message, finish


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def chat_stream(tokenizer: Any, outs: list[Output], messages: list[tuple[dict[str, Any], str]], *, rid: str, model: str,
                fingerprint: str, top_n: int | None, usage_obj: dict[str, int] | None) -> Iterator[str]:
    """The `chat.completion.chunk` events of finished choices, then `[DONE]`."""
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    for i, (out, (msg, finish)) in enumerate(zip(outs, messages)):
        yield chunk(i, {"role": "assistant", "content": ""})
        if msg.get("reasoning_content"):
            yield chunk(i, {"reasoning_content": msg["reasoning_content"]})
        content = msg.get("content") or ""
        if content == out.text:  # plain text: one delta per token, each with its log-probs
            for k, piece in enumerate(out.pieces):
                lp = chat_logprobs(tokenizer, out, top_n, k, k + 1) if top_n is not None else None
                if piece or lp is not None:
                    yield chunk(i, {"content": piece}, logprobs=lp)
        else:
            lp = chat_logprobs(tokenizer, out, top_n) if top_n is not None else None
            if content or lp is not None:
                yield chunk(i, {"content": content}, logprobs=lp)
        for j, call in enumerate(msg.get("tool_calls") or []):
            yield chunk(i, {"tool_calls": [{"index": j, "id": call["id"], "type": "function",
                                            "function": {"name": call["function"]["name"], "arguments": ""}}]})
            yield chunk(i, {"tool_calls": [{"index": j, "function": {"arguments": call["function"]["arguments"]}}]})
        yield chunk(i, {}, finish)
    if usage_obj is not None:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": fingerprint, "choices": [], "usage": usage_obj})
    yield "data: [DONE]\n\n"


def completion_stream(tokenizer: Any, outs: list[Output], *, rid: str, model: str, fingerprint: str,
                      top_n: int | None, usage_obj: dict[str, int] | None) -> Iterator[str]:
    """The `text_completion` events of finished choices, one per token, then `[DONE]`."""
    created = int(time.time())

    def chunk(index: int, text: str, finish: str | None, logprobs: Any) -> str:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})

    for i, out in enumerate(outs):
        for k, piece in enumerate(out.pieces):
            lp = completion_logprobs(tokenizer, out, top_n, k, k + 1) if top_n is not None else None
            if piece or lp is not None:
                yield chunk(i, piece, None, lp)
        yield chunk(i, "", out.finish_reason, None)
    if usage_obj is not None:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                   "system_fingerprint": fingerprint, "choices": [], "usage": usage_obj})
    yield "data: [DONE]\n\n"
