"""`mpa serve`: OpenAI chat with tools, request validation, batching, and the CLI process on loopback HTTP."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

import fastapi  # noqa: F401  (the serve extra; a missing install must fail, not skip)

from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.rollout.launch import format_command, sglang_launch_command  # noqa: E402
from mpa_jax.rollout.server import ServerThread, create_app  # noqa: E402
from mpa_jax.rollout.testing import ScriptedEngine, tiny_checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = [
    {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm.",
                                      "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                                                     "required": ["time"], "additionalProperties": False}}},
]


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


def test_openai_chat_with_tools_returns_parsed_tool_calls(tok):
    reply = "<think>\nThe user wants an alarm.\n</think>\n\n" + tk.format_tool_call("set_alarm", {"time": "07:00"})
    engine = ScriptedEngine(tok, [reply, "Your alarm is set for 7:00."])
    with ServerThread(create_app(engine, tok)) as server:
        messages = [{"role": "user", "content": "wake me at 7"}]
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "mpa", "messages": messages, "tools": TOOLS, "temperature": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "set_alarm"
        assert json.loads(call["function"]["arguments"]) == {"time": "07:00"}
        assert choice["message"]["reasoning_content"].strip() == "The user wants an alarm."
        # The prompt the engine saw is the chat template's rendering with the tool schemas.
        prompt = engine.calls[0][0][0]
        assert tok.decode(prompt) == tk.render_chat(tok, messages, TOOLS, add_generation_prompt=True)
        assert engine.calls[0][1].temperature == 0.0 and tok.token_id("<|im_end|>") in engine.calls[0][1].stop_token_ids

        # Second turn: the assistant tool call (arguments as a JSON string, OpenAI style) and the tool result.
        messages += [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": '{"ok": true}'}]
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in body["choices"][0]["message"]
        assert body["choices"][0]["message"]["content"] == "Your alarm is set for 7:00."
        assert body["usage"]["prompt_tokens"] == len(engine.calls[1][0][0])
        assert "<tool_response>" in tok.decode(engine.calls[1][0][0])


def _assert_400(resp: httpx.Response, field: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["field"] == field and field in err["message"]


def test_bad_requests_get_400_naming_the_field(tok):
    engine = ScriptedEngine(tok, ["hello"])
    with ServerThread(create_app(engine, tok)) as server:
        u = server.url
        _assert_400(httpx.post(u + "/generate", json={"sampling_params": {}}), "input_ids")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1, "x"]}), "input_ids")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [[1, 2], []]}), "input_ids[1]")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"temperature": -1}}),
                    "sampling_params.temperature")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}),
                    "sampling_params.max_new_tokens")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}),
                    "sampling_params.frequency_penalty")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"bogus": 1}}),
                    "sampling_params.bogus")
        _assert_400(httpx.post(u + "/generate", content=b"{not json", headers={"content-type": "application/json"}), "body")
        _assert_400(httpx.post(u + "/update_weights_from_disk", json={}), "model_path")
        _assert_400(httpx.post(u + "/v1/chat/completions", json={"messages": []}), "messages")
        _assert_400(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]}),
                    "messages[0].role")
        _assert_400(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                 "tools": [{"type": "function"}]}), "tools[0]")
        _assert_400(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 0}), "n")
        assert engine.calls == []  # nothing reached the engine


def test_engine_limits_are_checked_before_generation(tok, tmp_path):
    from mpa_jax.rollout.jax_engine import Engine

    ckpt = tiny_checkpoint(str(tmp_path / "c"), vocab_size=tok.vocab_size, seed=1, max_position_embeddings=64)
    with ServerThread(create_app(Engine.from_pretrained(ckpt), tok)) as server:
        u = server.url
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [[1, 2], [tok.vocab_size]], "sampling_params": {"max_new_tokens": 4}}), "input_ids[1]")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1] * 60, "sampling_params": {"max_new_tokens": 8}}), "input_ids")
        _assert_400(httpx.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "stop_token_ids": [10**6]}}),
                    "sampling_params.stop_token_ids")
        _assert_400(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi " * 80}]}), "max_tokens")
        _assert_400(httpx.post(u + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 70}), "max_tokens")


def test_concurrent_requests_are_batched_and_text_prompts_work(tok):
    engine = ScriptedEngine(tok, lambda ids, i: f"reply {i}")
    with ServerThread(create_app(engine, tok, max_batch=8, batch_wait_s=0.5)) as server:

        async def fire():
            async with httpx.AsyncClient(timeout=30) as c:
                reqs = [c.post(server.url + "/generate", json={"text": f"prompt {i}", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
                        for i in range(4)]
                return await asyncio.gather(*reqs)

        responses = asyncio.run(fire())
        assert all(r.status_code == 200 for r in responses)
        assert len(engine.calls) < 4 and sum(len(p) for p, _, _ in engine.calls) == 4
        item = responses[0].json()
        assert item["meta_info"]["finish_reason"]["type"] == "stop" and "output_token_logprobs" not in item["meta_info"]
        assert item["text"].startswith("reply")
        assert httpx.post(server.url + "/flush_cache").status_code == 200
        assert httpx.get(server.url + "/health_generate").status_code == 200
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "mpa"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mpa_serve_process_serves_a_checkpoint(tok, tmp_path):
    ckpt = tiny_checkpoint(str(tmp_path / "ckpt"), vocab_size=tok.vocab_size, seed=1)
    tok.save(ckpt)
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1", MPA_API_KEY="k1")
    cmd = [sys.executable, "-m", "mpa_jax.cli", "serve", "--config", os.path.join(REPO, "configs", "tiny.py"),
           "--workdir", str(tmp_path / "run"), "--checkpoint", ckpt, "--port", str(port), "--served-model-name", "tiny-planner"]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "mpa serve did not come up"
            time.sleep(0.2)
        assert httpx.get(url + "/model_info").status_code == 401  # $MPA_API_KEY is required
        auth = {"Authorization": "Bearer k1"}
        assert [m["id"] for m in httpx.get(url + "/v1/models", headers=auth).json()["data"]] == ["tiny-planner"]
        r = httpx.post(url + "/v1/chat/completions", headers=auth, json={"model": "ckpt", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404 and "tiny-planner" in r.json()["error"]["message"]
        info = httpx.get(url + "/model_info", headers=auth).json()
        assert info["model_path"] == ckpt and info["weight_version"] == "ckpt"
        r = httpx.post(url + "/generate", headers=auth, json={"input_ids": tok.encode("call mom"), "return_logprob": True,
                                                "sampling_params": {"max_new_tokens": 5, "temperature": 0}}, timeout=60)
        out = r.json()
        assert r.status_code == 200 and 1 <= len(out["output_ids"]) <= 5
        assert [e[1] for e in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
        r = httpx.post(url + "/v1/chat/completions", headers=auth, json={"model": "tiny-planner", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                                                           "max_tokens": 4, "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_sglang_launch_command(tmp_path):
    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    cmd = sglang_launch_command(str(ckpt), tp=2, dp=1, mem_fraction=0.8)
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--model-path"] == str(ckpt) and flags["--tp-size"] == "2" and flags["--mem-fraction-static"] == "0.8"
    assert flags["--tool-call-parser"] == "qwen25" and flags["--reasoning-parser"] == "qwen3"
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    assert "qwen3_coder" in format_command(sglang_launch_command(str(ckpt)))
    with pytest.raises(ValueError, match="mem_fraction"):
        sglang_launch_command(str(ckpt), mem_fraction=1.5)
    with pytest.raises(ValueError, match="no config.json"):
        sglang_launch_command(str(tmp_path))
