"""`mpa serve`'s API key and limits over loopback HTTP: 401 on every route but /health, 413 for a body over
the limit before it is read (declared or chunked), 400 for prompts over the character and token limits,
429 when the running and queued requests are at their limits, a warning for a non-loopback bind without
a key, and the key resolution (flag, $MPA_API_KEY, config).

The model is a `ScriptedEngine` (a test double replaying fixed text; one test holds it on an event to keep
a request running): the checks under test are the server's, before and around the model.
"""
from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import openai
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.commands.serve import bind_warning, is_loopback, resolve_api_key
from mpa_jax.config import load_config_file
from mpa_jax.rollout.server import Limits, ServerThread, create_app
from mpa_jax.rollout.testing import ScriptedEngine

KEY = "k-123"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


def _limits(**kw) -> Limits:
    base = dict(max_body_bytes=64 * 1024, max_prompt_chars=2000, max_prompt_tokens=600, max_concurrent_requests=8,
                max_queued_requests=8)
    return Limits(**{**base, **kw})


def _raw(port: int, head: bytes, body_parts: list[bytes] = ()) -> bytes:
    """Send a request by hand (headers, then body parts) and read the answer: a body can be declared
    larger than what is sent, or sent chunked."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        for part in body_parts:
            try:
                s.sendall(part)
            except OSError:  # the server answered and closed: the rest is not needed
                break
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def test_api_key_on_every_route_but_health(tok):
    app = create_app(ScriptedEngine(tok, ["hi"]), tok, api_key=KEY)
    with ServerThread(app) as server:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/generate"),
                             ("GET", "/server_info"), ("GET", "/get_load"), ("POST", "/update_weights_from_disk"),
                             ("GET", "/health_generate"), ("GET", "/nope")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
                r = httpx.request(method, server.url + path, headers=headers, json={})
                assert r.status_code == 401, (path, headers, r.text)
                err = r.json()["error"]
                assert err["code"] == 401 and "Authorization: Bearer" in err["message"] and "\n" not in r.text
        assert httpx.get(server.url + "/health").status_code == 200
        ok = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        assert ok.chat.completions.create(model="mpa", messages=USER).choices[0].message.content == "hi"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="other", max_retries=0).models.list()


def test_body_over_the_limit_is_413_before_it_is_read(tok):
    limits = _limits()
    app = create_app(ScriptedEngine(tok, ["hi"]), tok, limits=limits)
    with ServerThread(app) as server:
        # Declared 64 MB, nothing of it sent: the answer comes at once (the body is never read).
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 67108864\r\n\r\n")
        answer = _raw(server.port, head)
        assert answer.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in answer, answer[:300]
        # Chunked (no Content-Length): refused as soon as the bytes read pass the limit.
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        piece = b"x" * 16384
        chunks = [b"%x\r\n" % len(piece) + piece + b"\r\n"] * 64 + [b"0\r\n\r\n"]  # 1 MiB in all
        answer = _raw(server.port, head, chunks)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        # A chunked body under the limit is read whole and answered.
        body = b'{"messages": [{"role": "user", "content": "hello"}]}'
        answer = _raw(server.port, head, [b"%x\r\n" % len(body) + body + b"\r\n", b"0\r\n\r\n"])
        assert answer.startswith(b"HTTP/1.1 200") and b'"hi"' in answer, answer[:300]
        # Through a client: one line naming the limit.
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 70000}]})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]


def test_prompt_characters_and_tokens_over_the_limits_are_400(tok):
    app = create_app(ScriptedEngine(tok, ["hi"]), tok, limits=_limits(max_prompt_chars=2000, max_prompt_tokens=300))
    with ServerThread(app) as server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="max_prompt_chars") as e:
            c.chat.completions.create(model="mpa", messages=[{"role": "user", "content": "word " * 500}])
        assert e.value.body["param"] == "messages"
        with pytest.raises(openai.BadRequestError, match="max_prompt_chars"):
            c.completions.create(model="mpa", prompt="word " * 500)
        r = httpx.post(server.url + "/generate", json={"text": "word " * 500})
        assert r.status_code == 400 and "max_prompt_chars" in r.json()["error"]["message"]
        # Under the character limit but over the token limit (one token per character, about).
        spaced = " ".join("qz"[i % 2] for i in range(900))
        assert len(tok.encode(spaced)) > 300
        with pytest.raises(openai.BadRequestError, match="max_prompt_tokens"):
            c.chat.completions.create(model="mpa", messages=[{"role": "user", "content": spaced}])
        r = httpx.post(server.url + "/generate", json={"input_ids": [5] * 301})
        assert r.status_code == 400 and "max_prompt_tokens" in r.json()["error"]["message"]
        assert c.chat.completions.create(model="mpa", messages=USER).choices[0].message.content == "hi"


def test_running_and_queued_requests_at_their_limits_get_429(tok):
    started, release = threading.Event(), threading.Event()

    def script(_ids, _i):
        started.set()
        release.wait(30)  # hold the request running until the test lets it go
        return "done"

    engine = ScriptedEngine(tok, script)
    app = create_app(engine, tok, limits=_limits(max_concurrent_requests=1, max_queued_requests=1), batcher="call")
    with ServerThread(app) as server:
        async def go():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
                first = asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER}))
                while not started.is_set():  # the first request is inside the engine (it holds the turn)
                    await asyncio.sleep(0.01)
                second = asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER}))
                while app.state.admission.waiting < 1:  # the second waits for the turn
                    await asyncio.sleep(0.01)
                third = await c.post("/v1/chat/completions", json={"messages": USER})
                health = await c.get("/health")
                release.set()
                return await first, await second, third, health

        first, second, third, health = asyncio.run(go())
    assert third.status_code == 429 and third.headers["retry-after"] == "1"
    assert "1 requests running and 1 queued" in third.json()["error"]["message"]
    assert health.status_code == 200  # other routes are not queued
    for r in (first, second):
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "done"


def test_api_key_resolution_loopback_and_config_keys(monkeypatch):
    config = load_config_file("configs/tiny.py")
    Limits.from_config(config.serve)  # every limit has its key in the serve section
    monkeypatch.delenv("MPA_API_KEY", raising=False)
    assert resolve_api_key(None, config.serve) == str(config.serve.api_key) == ""
    monkeypatch.setenv("MPA_API_KEY", "from-env")
    assert resolve_api_key(None, config.serve) == "from-env" and resolve_api_key("flag", config.serve) == "flag"
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "example.com"))
    assert "without an API key" in bind_warning("0.0.0.0", "") and "MPA_API_KEY" in bind_warning("0.0.0.0", "")
    assert bind_warning("0.0.0.0", "k") is None and bind_warning("127.0.0.1", "") is None
    with pytest.raises(ValueError, match="max_queued_requests"):
        Limits(1, 1, 1, 1, -1)


def test_the_projects_sglang_client_and_fleet_send_the_key(tok):
    """`SGLangEngine` (the RL trainer's client for SGLang servers and `mpa serve`), single and as a fleet of
    two workers, against servers that require the key."""
    from mpa_jax.rollout.sglang import SGLangEngine
    from mpa_jax.rollout.types import EngineError, SamplingParams

    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(tok.token_id("<|im_end|>"),))
    want = tok.encode("hi") + [tok.token_id("<|im_end|>")]
    with ServerThread(create_app(ScriptedEngine(tok, ["hi"]), tok, api_key=KEY)) as a, \
            ServerThread(create_app(ScriptedEngine(tok, ["hi"]), tok, api_key=KEY)) as b:
        for engine in (SGLangEngine(a.url, router=False, api_key=KEY, max_retries=0),
                       SGLangEngine(workers=[a.url, b.url], api_key=KEY, max_retries=0)):
            results = engine.generate([tok.encode("hello"), tok.encode("there")], params, seeds=[1, 2])
            assert [r.token_ids for r in results] == [want, want]
        with pytest.raises(EngineError, match="401"):
            SGLangEngine(a.url, router=False, max_retries=0).generate([tok.encode("hello")], params, seeds=[1])
