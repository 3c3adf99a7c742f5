"""The slot decode loop behind `mpa serve` (`rollout.slots`, `server.slot_batcher`): requests join the
running batch between decode chunks, give the engine's own tokens, and stream as they are decoded
(official `openai` client over loopback HTTP)."""
from __future__ import annotations

import threading
import time

import numpy as np
import openai
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.rollout.jax_engine import JaxEngine
from mpa_jax.rollout.server import ServerThread, SlotBatcher, create_app
from mpa_jax.rollout.slots import SlotDecoder, SlotLoop, SlotRequest, slot_support, timed_wait
from mpa_jax.rollout.testing import ScriptedEngine, tiny_checkpoint
from mpa_jax.rollout.types import SamplingParams


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


@pytest.fixture(scope="module")
def ckpt(tok, tmp_path_factory):
    return tiny_checkpoint(str(tmp_path_factory.mktemp("slots") / "m"), vocab_size=tok.vocab_size + 200, seed=5)


class _Collect:
    """Final updates of SlotRequests, by name, with the time each finished."""

    def __init__(self) -> None:
        self.done: dict[str, object] = {}
        self.at: dict[str, float] = {}
        self.cv = threading.Condition()

    def cb(self, name: str):
        def f(u):
            if u.result is not None or u.error is not None:
                with self.cv:
                    self.done[name], self.at[name] = u, time.monotonic()
                    self.cv.notify_all()
        return f

    def wait(self, n: int, timeout: float = 120) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.done) >= n, timeout), self.done.keys()


def _assert_engine_results(got: "_Collect", ref: list) -> None:
    """Each collected result has the engine's own tokens, finish reason and log-probs."""
    for i, want in enumerate(ref):
        r = got.done[str(i)].result
        assert r.token_ids == want.token_ids and r.finish_reason == want.finish_reason, i
        assert np.allclose(r.logprobs, want.logprobs, atol=1e-4)


def test_slot_loop_gives_the_engines_tokens_and_admits_mid_generation(ckpt, tok):
    engine = JaxEngine.from_pretrained(ckpt, max_batch=8, vocab_limit=tok.vocab_size)
    loop = SlotLoop(SlotDecoder(engine, slots=4, max_len=96, chunk=2))
    try:
        rng = np.random.default_rng(0)
        prompts = [[int(x) for x in rng.integers(1, tok.vocab_size, size=n)] for n in (5, 9, 12, 3, 7, 40)]
        settings = [SamplingParams(max_new_tokens=m, temperature=t, top_k=k, stop_token_ids=(3,))
                    for m, t, k in [(10, 0.0, -1), (17, 1.0, -1), (5, 0.7, 20), (12, 0.0, -1), (9, 1.5, -1), (60, 1.0, -1)]]
        ref = engine.generate_rows(prompts, settings, list(range(6)), 2)
        got = _Collect()
        # More requests than slots (4): the last ones wait for free slots; one does not fit a slot at all.
        for i in range(6):
            loop.submit(SlotRequest(prompts[i], settings[i], i, 2, got.cb(str(i))))
        got.wait(6)
        _assert_engine_results(got, ref)
        for i in range(6):
            r = got.done[str(i)].result
            assert [t for t, _ in r.top_logprobs[0]] == [t for t, _ in ref[i].top_logprobs[0]]
        assert loop.fallback_rows == 1  # 40 prompt tokens -> bucket 64, + 60 new > 96: one whole engine call
        # A short request sent while a long one runs finishes first: it joined the running batch.
        got = _Collect()
        long = SamplingParams(max_new_tokens=80, temperature=1.0, stop_token_ids=())
        loop.submit(SlotRequest(prompts[0], long, 1, 0, got.cb("long")))
        assert timed_wait(lambda: loop.admitted >= 6, 60)
        steps0 = loop.dec.steps
        assert timed_wait(lambda: loop.dec.steps > steps0, 60)  # the long one is decoding
        loop.submit(SlotRequest(prompts[1], SamplingParams(max_new_tokens=4, temperature=0.0), 2, 0, got.cb("short")))
        got.wait(2)
        assert got.at["short"] < got.at["long"] and len(got.done["long"].result.token_ids) == 80
        assert loop.idle
    finally:
        loop.close()


def test_slot_loop_over_two_replicas_gives_the_engines_tokens(ckpt, tok):
    """Slots split over two engine replicas (one program per replica under shard_map), rows admitted at
    different ring heads, long chunks while nobody waits: still the engine's own tokens."""
    import jax

    # conftest forces 8 host devices; a run that overrides XLA_FLAGS with fewer must not pass silently
    assert jax.local_device_count() >= 2, "needs 2 host devices (XLA_FLAGS=--xla_force_host_platform_device_count)"
    engine = JaxEngine.from_pretrained(ckpt, max_batch=8, vocab_limit=tok.vocab_size, replicas=2)
    # max_prefill 1: an admission of 3 prompts is split into prefill calls of one prompt per replica.
    dec = SlotDecoder(engine, slots=4, max_len=64, chunk=2, max_prefill=1)
    assert dec.replicas == 2 and dec.long_chunk == 8
    loop = SlotLoop(dec)
    try:
        rng = np.random.default_rng(1)
        prompts = [[int(x) for x in rng.integers(1, tok.vocab_size, size=n)] for n in (6, 11, 3, 14, 9, 5)]
        settings = [SamplingParams(max_new_tokens=m, temperature=t, stop_token_ids=(3,))
                    for m, t in [(30, 1.0), (12, 0.0), (40, 0.7), (7, 1.0), (25, 1.5), (33, 0.0)]]
        ref = engine.generate_rows(prompts, settings, list(range(6)))
        got = _Collect()
        loop.submit(SlotRequest(prompts[0], settings[0], 0, 0, got.cb("0")))  # alone first: long chunks
        assert timed_wait(lambda: loop.dec.steps >= 2, 60)
        for i in range(1, 6):  # more requests than slots, admitted as slots free up (other ring heads)
            loop.submit(SlotRequest(prompts[i], settings[i], i, 0, got.cb(str(i))))
        got.wait(6)
        _assert_engine_results(got, ref)
        assert loop.admitted == 6 and dec.prefills >= 3  # at most one prompt per replica per call
    finally:
        loop.close()


def test_support_and_fallback(tok):
    assert "JaxEngine" in slot_support(ScriptedEngine(tok, ["hi"]))
    app = create_app(ScriptedEngine(tok, ["hi"]), tok, batcher="slots")  # not supported: the call batcher
    with ServerThread(app):
        assert app.state.get_batcher().kind == "call"
    with pytest.raises(ValueError, match="batcher"):
        create_app(ScriptedEngine(tok, ["hi"]), tok, batcher="steps")


def test_stream_arrives_while_generating_and_a_closed_stream_frees_its_slot(ckpt, tok):
    engine = JaxEngine.from_pretrained(ckpt, max_batch=4, vocab_limit=tok.vocab_size)
    app = create_app(engine, tok, max_batch=4, slot_len=512, slot_chunk=2)
    with ServerThread(app) as server:
        batcher = app.state.get_batcher()
        assert isinstance(batcher, SlotBatcher)
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        kw = dict(model="mpa", prompt="set an alarm", max_tokens=160, temperature=0.0)
        c.completions.create(**{**kw, "max_tokens": 8})  # compile outside the timed run
        t0 = time.monotonic()
        arrivals, text = [], ""
        for chunk in c.completions.create(**kw, stream=True):
            if chunk.choices and chunk.choices[0].text:
                arrivals.append(time.monotonic() - t0)
                text += chunk.choices[0].text
        total = time.monotonic() - t0
        whole = c.completions.create(**kw)
        assert text == whole.choices[0].text and whole.usage.completion_tokens >= 64
        # Content came in many pieces spread over the run, the first well before the end (with the
        # call batcher every piece arrives together, after the whole generation).
        assert len(set(arrivals)) > 3
        assert arrivals[0] < 0.5 * arrivals[-1] and arrivals[-1] <= total
        # A client that closes its stream frees the slot long before max_tokens.
        stream = c.completions.create(**{**kw, "max_tokens": 400}, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        assert timed_wait(lambda: batcher.loop.idle, 60) and batcher.loop.cancelled_rows == 1


def test_streamed_tool_calls_go_out_as_each_call_closes(tok):
    """Each tool call is sent when its `</tool_call>` is decoded, before the text after it (a scripted
    engine: a random model writes no tool calls; its tokens are fed one update per token)."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("set_alarm", "send_sms")]
    reply = (tk.format_tool_call("set_alarm", {"time": "07:00"}) + "\n" + tk.format_tool_call("send_sms", {"to": "mom"})
             + "\nDone, both sent.")
    with ServerThread(create_app(ScriptedEngine(tok, lambda ids, i: reply), tok)) as server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        whole = c.chat.completions.create(model="mpa", messages=[{"role": "user", "content": "x"}], tools=tools)
        events, calls, content, finish = [], {}, "", None
        for chunk in c.chat.completions.create(model="mpa", messages=[{"role": "user", "content": "x"}], tools=tools,
                                               stream=True):
            d = chunk.choices[0].delta
            for t in d.tool_calls or []:
                entry = calls.setdefault(t.index, {"name": "", "arguments": ""})
                entry["name"] += t.function.name or ""
                entry["arguments"] += t.function.arguments or ""
                events.append(("call", t.index))
            if d.content:
                content += d.content
                events.append(("content", None))
            finish = chunk.choices[0].finish_reason or finish
    want = {i: {"name": t.function.name, "arguments": t.function.arguments} for i, t in enumerate(whole.choices[0].message.tool_calls)}
    assert calls == want and [v["name"] for v in calls.values()] == ["set_alarm", "send_sms"]
    assert content == whole.choices[0].message.content == "Done, both sent." and finish == "tool_calls"
    assert events.index(("call", 1)) < events.index(("content", None))  # the calls went out before the text after them
