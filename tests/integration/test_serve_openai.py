"""`mpa serve` driven by the official `openai` client over loopback HTTP: chat and completions, streaming
(content and tool-call deltas), n, seed, logprobs/top_logprobs, stop strings, usage, models, 400s naming
the field, and 64 concurrent sampled requests on a padded-vocabulary model."""
from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

import jax  # noqa: F401
import openai

from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.rollout.server import ServerThread, create_app  # noqa: E402
from mpa_jax.rollout.testing import ScriptedEngine, tiny_checkpoint  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm.",
                                           "parameters": {"type": "object", "properties": {"time": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "wake me at 7"}]


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


@pytest.fixture(scope="module")
def real(tok, tmp_path_factory):
    """A random tiny model whose embedding is padded past the tokenizer (as the tiny config's), served."""
    ckpt = tiny_checkpoint(str(tmp_path_factory.mktemp("oa") / "m"), vocab_size=tok.vocab_size + 200, seed=4)
    engine = Engine.from_pretrained(ckpt, max_batch=32, vocab_limit=tok.vocab_size)
    app = create_app(engine, tok, max_batch=64, batch_wait_s=0.05)
    with ServerThread(app) as server:
        yield server, app, engine


def _client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120, **kw)


def test_chat_tool_calls_plain_and_streamed(tok):
    reply = "<think>\nAlarm.\n</think>\n\n" + tk.format_tool_call("set_alarm", {"time": "07:00"})
    engine = ScriptedEngine(tok, [reply])
    with ServerThread(create_app(engine, tok)) as server:
        c = _client(server)
        r = c.chat.completions.create(model="mpa", messages=USER, tools=TOOLS, temperature=0)
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "set_alarm"
        assert json.loads(call.function.arguments) == {"time": "07:00"}
        assert r.usage.prompt_tokens == len(engine.calls[0][0][0]) and r.usage.completion_tokens == len(tok.encode(reply)) + 1
        # Streamed: tool-call deltas in OpenAI's chunk format, reassembled by index as clients do.
        calls: dict[int, dict] = {}
        finish, reasoning = None, ""
        for chunk in c.chat.completions.create(model="mpa", messages=USER, tools=TOOLS, temperature=0, stream=True,
                                               stream_options={"include_usage": True}):
            if chunk.usage is not None:
                assert chunk.usage.completion_tokens == r.usage.completion_tokens and not chunk.choices
                continue
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for d in delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and calls == {0: {"name": "set_alarm", "arguments": call.function.arguments}}
        assert reasoning.strip() == "Alarm."


def test_stop_strings_and_completions_text(tok):
    engine = ScriptedEngine(tok, lambda ids, i: "Hello world. Bye now")
    with ServerThread(create_app(engine, tok)) as server:
        c = _client(server)
        r = c.chat.completions.create(model="mpa", messages=USER, stop=["world", "zzz"])
        assert r.choices[0].message.content == "Hello" and r.choices[0].finish_reason == "stop"  # chat content is stripped
        streamed = "".join(ch.choices[0].delta.content or "" for ch in
                           c.chat.completions.create(model="mpa", messages=USER, stop="Bye", stream=True) if ch.choices)
        assert streamed == "Hello world."
        r = c.completions.create(model="mpa", prompt="say hi", max_tokens=50, stop=". ")
        assert r.choices[0].text == "Hello world" and r.choices[0].finish_reason == "stop" and r.object == "text_completion"
        r = c.completions.create(model="mpa", prompt=[tok.encode("say hi"), tok.encode("and more")], max_tokens=50, n=2)
        assert len(r.choices) == 4 and all(ch.text == "Hello world. Bye now" for ch in r.choices)
        assert [m.id for m in c.models.list().data] == ["mpa"] and c.models.retrieve("mpa").id == "mpa"


def test_sampling_n_seed_logprobs_and_streams_agree(real, tok):
    server, _app, engine = real
    c = _client(server)
    kw = dict(model="mpa", messages=USER, max_tokens=8, temperature=1.0, n=3, seed=11, logprobs=True, top_logprobs=3)
    a = c.chat.completions.create(**kw)
    b = c.chat.completions.create(**kw)
    assert len(a.choices) == 3 and [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
    assert len({ch.message.content for ch in a.choices}) > 1  # different seeds per choice
    assert a.usage.completion_tokens == sum(len(ch.logprobs.content) + (ch.finish_reason == "stop") for ch in a.choices)
    for ch in a.choices:
        for entry in ch.logprobs.content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            tops = [t.logprob for t in entry.top_logprobs]
            assert tops == sorted(tops, reverse=True) and entry.logprob <= tops[0] + 1e-5
        assert (ch.message.content or "").strip() in "".join(e.token for e in ch.logprobs.content)  # the tokens behind the text
    # The stream of the same request carries the same choices, token by token, with the same log-probs.
    got: dict[int, str] = {}
    lps: dict[int, list[float]] = {}
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            got[ch.index] = got.get(ch.index, "") + (ch.delta.content or "")
            if ch.logprobs is not None:
                lps.setdefault(ch.index, []).extend(e.logprob for e in ch.logprobs.content)
    assert [got[i] for i in range(3)] == [ch.message.content or "" for ch in a.choices]
    # Equal up to float rounding: the slot loop's ring caches hold a request's keys in an order that
    # depends on when it was admitted, so attention sums in another order (~1e-6).
    assert all(math.isclose(x, y.logprob, abs_tol=1e-5) for i, ch in enumerate(a.choices)
               for x, y in zip(lps.get(i, []), ch.logprobs.content))
    # Completions over token ids, with log-probs, streamed.
    ids = tok.encode("call mom")
    r = c.completions.create(model="mpa", prompt=ids, max_tokens=6, temperature=1.5, seed=3, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) and all(len(t) <= 2 for t in lp.top_logprobs)
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="mpa", prompt=ids, max_tokens=6, temperature=1.5,
                                                                     seed=3, stream=True) if ch.choices)
    assert text == r.choices[0].text


def test_bad_values_are_400_naming_the_field_never_a_traceback(real):
    server, _app, _engine = real
    c = _client(server)
    cases = [
        ({"temperature": 2.5}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"n": 0}, "n"), ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**6}, "max_tokens"), ({"seed": -1}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"), ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"), ({"stop": ["a"] * 5}, "stop"),
        ({"tool_choice": "required"}, "tool_choice"), ({"extra_body": {"mirostat": 1}}, "mirostat"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS}, "tool_choice"),
        ({"metadata": "x"}, "metadata"), ({"store": "yes"}, "store"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ]
    for extra, field in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="mpa", messages=USER, **extra)
        err = e.value.body
        assert err["field"] == field and field in err["message"] and "Traceback" not in str(err), (extra, err)
    # Non-finite numbers (the openai client cannot send them; raw JSON can).
    for field, raw in (("temperature", b"NaN"), ("top_p", b"Infinity"), ("temperature", b"-Infinity")):
        r = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "x"}], "'
                       + field.encode() + b'": ' + raw + b"}", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["field"] == field and "finite" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="echo"):
        c.completions.create(model="mpa", prompt="x", echo=True)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        c.completions.create(model="mpa", prompt=[])
    # /generate (native) with hot temperatures on the padded model now answers, NaN is a 400.
    for t in (1.0, 1.5):
        r = httpx.post(server.url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"temperature": t, "max_new_tokens": 8}})
        assert r.status_code == 200 and len(r.json()["output_ids"]) >= 1
    r = httpx.post(server.url + "/generate", content=b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "sampling_params.temperature"


def test_64_concurrent_sampled_chats_all_answer(real, tok):
    server, app, engine = real
    batcher = app.state.get_batcher()
    calls0 = batcher.calls

    async def fire():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        reqs = [c.chat.completions.create(model="mpa", messages=[{"role": "user", "content": f"request {i}"}],
                                          max_tokens=6, temperature=0.7, seed=i) for i in range(64)]
        try:
            return await asyncio.gather(*reqs)
        finally:
            await c.close()

    responses = asyncio.run(fire())
    assert len(responses) == 64
    for r in responses:
        ch = r.choices[0]
        assert ch.finish_reason in ("stop", "length") and isinstance(ch.message.content, (str, type(None)))
        assert 1 <= r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 0
    assert len({r.id for r in responses}) == 64
    assert batcher.calls - calls0 < 64  # requests shared engine calls
