"""The slot decode loop behind `mpa serve` (`rollout.slots`, `server.slot_batcher`): requests join the
running batch between decode chunks, give the engine's own tokens, and stream as they are decoded
(official `openai` client over loopback HTTP)."""
from __future__ import annotations

import threading

import httpx
import numpy as np
import openai
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.rollout.jax_engine import Engine
from mpa_jax.rollout.server import ServerThread, SlotBatcher, create_app
from mpa_jax.rollout.slots import slot_support, timed_wait
from mpa_jax.rollout.testing import ScriptedEngine, tiny_checkpoint
from mpa_jax.rollout.types import SamplingParams


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


@pytest.fixture(scope="module")
def ckpt(tok, tmp_path_factory):
    return tiny_checkpoint(str(tmp_path_factory.mktemp("slots") / "m"), vocab_size=tok.vocab_size + 200, seed=5)


def _assert_engine_results(got: list, ref: list) -> None:
    """Each result has the whole-batch program's tokens, finish reason and log-probs."""
    for i, (r, want) in enumerate(zip(got, ref)):
        assert r.token_ids == want.token_ids and r.finish_reason == want.finish_reason, i
        assert np.allclose(r.logprobs, want.logprobs, atol=1e-4)


def test_slots_give_the_engines_tokens_and_admit_mid_generation(ckpt, tok):
    engine = Engine.from_pretrained(ckpt, max_batch=8, slots=4, slot_len=96, chunk=2, vocab_limit=tok.vocab_size)
    try:
        rng = np.random.default_rng(0)
        prompts = [[int(x) for x in rng.integers(1, tok.vocab_size, size=n)] for n in (5, 9, 12, 3, 7, 40)]
        settings = [SamplingParams(max_new_tokens=m, temperature=t, top_k=k, stop_token_ids=(3,))
                    for m, t, k in [(10, 0.0, -1), (17, 1.0, -1), (5, 0.7, 20), (12, 0.0, -1), (9, 1.5, -1), (60, 1.0, -1)]]
        ref = engine.generate_batch(prompts, settings, list(range(6)), 2)
        # More requests than slots (4): the last ones wait for free slots; one does not fit a slot at all.
        got = [f.result(300) for f in [engine.submit(prompts[i], settings[i], i, top_logprobs=2) for i in range(6)]]
        _assert_engine_results(got, ref)
        for r, want in zip(got, ref):
            assert [t for t, _ in r.top_logprobs[0]] == [t for t, _ in want.top_logprobs[0]]
        # 40 prompt + 60 new > 96: a larger private decoder, for the reference (generate_batch runs on the same
        # loop) and for the submitted request
        assert engine.stats()["fallback_rows"] == 2
        # A short request sent while a long one runs finishes first: it joined the running batch (counted:
        # the long one had streamed only part of its tokens when the short one's result came).
        streamed: list[int] = []
        decoding = threading.Event()
        long = engine.submit(prompts[0], SamplingParams(max_new_tokens=80, temperature=1.0), 1,
                             on_update=lambda u: (streamed.extend(u.token_ids), decoding.set()))
        assert decoding.wait(120)
        engine.submit(prompts[1], SamplingParams(max_new_tokens=4, temperature=0.0), 2).result(120)
        assert len(streamed) < 80 and not long.done()
        assert len(long.result(120).token_ids) == 80 and not engine.busy
    finally:
        engine.close()


def test_slots_over_two_replicas_give_the_engines_tokens(ckpt, tok):
    """Slots split over two engine replicas (one program per replica under shard_map), rows admitted at
    different ring heads, long chunks while nobody waits: still the whole-batch program's tokens."""
    import jax

    # conftest forces 8 host devices; a run that overrides XLA_FLAGS with fewer must not pass silently
    assert jax.local_device_count() >= 2, "needs 2 host devices (XLA_FLAGS=--xla_force_host_platform_device_count)"
    # max_prefill 1: an admission of 3 prompts is split into prefill calls of one prompt per replica.
    engine = Engine.from_pretrained(ckpt, max_batch=8, slots=4, slot_len=64, chunk=2, max_prefill=1,
                                    vocab_limit=tok.vocab_size, replicas=2)
    try:
        assert engine.replicas == 2 and engine.slots == 4 and engine.replica_mesh.devices.size == 2
        rng = np.random.default_rng(1)
        prompts = [[int(x) for x in rng.integers(1, tok.vocab_size, size=n)] for n in (6, 11, 3, 14, 9, 5)]
        settings = [SamplingParams(max_new_tokens=m, temperature=t, stop_token_ids=(3,))
                    for m, t in [(30, 1.0), (12, 0.0), (40, 0.7), (7, 1.0), (25, 1.5), (33, 0.0)]]
        ref = engine.generate_batch(prompts, settings, list(range(6)))
        started = threading.Event()
        first = engine.submit(prompts[0], settings[0], 0, on_update=lambda u: started.set())  # alone first: long chunks
        assert started.wait(120)
        # More requests than slots, admitted as slots free up (at other ring heads).
        rest = [engine.submit(prompts[i], settings[i], i) for i in range(1, 6)]
        _assert_engine_results([first.result(300)] + [f.result(300) for f in rest], ref)
        stats = engine.stats()
        assert stats["admitted"] == 12 and stats["prefills"] >= 3  # 6 + the reference's 6 (same loop); one prompt per replica per call
    finally:
        engine.close()


def test_support_and_fallback(tok):
    assert "not the embedded engine" in slot_support(ScriptedEngine(tok, ["hi"]))
    app = create_app(ScriptedEngine(tok, ["hi"]), tok, batcher="slots")  # not supported: the call batcher
    with ServerThread(app):
        assert app.state.get_batcher().kind == "call"
    with pytest.raises(ValueError, match="batcher"):
        create_app(ScriptedEngine(tok, ["hi"]), tok, batcher="steps")


def test_stream_arrives_while_generating_and_a_closed_stream_frees_its_slot(ckpt, tok):
    engine = Engine.from_pretrained(ckpt, max_batch=4, vocab_limit=tok.vocab_size)
    app = create_app(engine, tok, max_batch=4, slot_len=512, slot_chunk=2)
    with ServerThread(app) as server:
        batcher = app.state.get_batcher()
        assert isinstance(batcher, SlotBatcher) and engine.slots == 4 and engine.slot_len == 512
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        kw = dict(model="mpa", prompt="set an alarm", max_tokens=160, temperature=0.0)
        c.completions.create(**{**kw, "max_tokens": 8})  # compile outside the streamed run
        finished = engine.stats()["finished"]
        pieces, text, open_at_first = 0, "", None
        for chunk in c.completions.create(**kw, stream=True):
            if chunk.choices and chunk.choices[0].text:
                if open_at_first is None:  # counted, not timed: was the request still decoding then?
                    open_at_first = engine.stats()["finished"] == finished
                pieces += 1
                text += chunk.choices[0].text
        whole = c.completions.create(**kw)
        assert text == whole.choices[0].text and whole.usage.completion_tokens >= 64
        # Content came in many pieces, the first while the request was still decoding (with the call
        # batcher every piece arrives together, after the whole generation).
        assert pieces > 3 and open_at_first
        # A client that closes its stream frees the slot long before max_tokens.
        cancelled = engine.stats()["cancelled_rows"]
        stream = c.completions.create(**{**kw, "max_tokens": 400}, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        assert timed_wait(lambda: not engine.busy, 60) and engine.stats()["cancelled_rows"] == cancelled + 1
        # The prefix cache as SGLang and OpenAI report it: the same prompt again is served from the rows that
        # hold it (all of it, or all but its last token, reused), and /server_info carries the running totals and programs.
        again = c.completions.create(**{**kw, "max_tokens": 4})
        n_prompt = again.usage.prompt_tokens
        assert n_prompt - 1 <= again.usage.prompt_tokens_details.cached_tokens <= n_prompt
        ids = tok.encode("set an alarm")
        native = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2,
                            "temperature": 0.0}}, timeout=120).json()
        assert len(ids) - 1 <= native["meta_info"]["cached_tokens"] <= len(ids)
        state = httpx.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]
        assert state["cached_tokens"] >= n_prompt - 1 + len(ids) - 1 and 1 <= state["programs"] <= 6


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
