"""Planner backends behind one interface: OpenAI-compatible chat over loopback HTTP against `mpa serve`,
the engine backend, and backend failures (down, timeout, HTTP 500, garbage, bad tool calls) turning
into INFRA/TIMEOUT/parse Feedback instead of crashes.

The model behind `mpa serve` is `ScriptedEngine` (a test double of the *model* only: the server, the
HTTP, the chat template, the tool-call parsing and the harness are all real)."""
from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

import fastapi  # noqa: F401  (the serve extra; a missing install must fail, not skip)

from mpa_jax import tokenizer as tk
from mpa_jax.envs import ErrorCode, load_tasks, make_env
from mpa_jax.harness import HarnessConfig, HarnessSession
from mpa_jax.envs.episode import run_chat_episode
from mpa_jax.harness.planners import EnginePlanner, OpenAIChatPlanner, ScriptedPlanner
from mpa_jax.rollout.server import ServerThread, create_app
from mpa_jax.rollout.testing import ScriptedEngine
from mpa_jax.rollout.types import EngineError, SamplingParams


@pytest.fixture(scope="module")
def tasks():
    return [t for t in load_tasks("dev") if t.category == "tool_use" and not t.faults][:3]


def _gold_script(tok, tasks):
    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.instruction in text)
        turn = text.count("<|im_start|>assistant") - 1
        g = task.gold[min(turn, len(task.gold) - 1)]
        return tk.format_tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else g["text"]

    return script


def test_openai_compatible_backend_against_mpa_serve_with_harness_on_and_off(tok, tasks):
    engine = ScriptedEngine(tok, _gold_script(tok, tasks))
    with ServerThread(create_app(engine, tok)) as server:
        planner = OpenAIChatPlanner(server.url + "/v1", timeout_s=30)
        for session in (None, HarnessSession(HarnessConfig.defaults(enabled=True, tools="catalog"))):
            for task in tasks:
                env = session.env_factory() if session else make_env("sandbox")
                traj = run_chat_episode(planner, env, task, max_turns=8).trajectory(session.version_label if session else "none")
                assert traj.verification.success and traj.finish_reason == "answer", (task.id, traj.steps)
                assert traj.costs["output_tokens"] > 0 and traj.costs["input_tokens"] > 0
    # Every request carried the tools (OpenAI `tools`) and the chat.
    assert all(len(p) == 1 for p, _, _ in engine.calls)


def test_openai_backend_parse_error_is_feedback_and_the_episode_goes_on(tok, tasks):
    task = tasks[0]
    g = task.gold
    replies = ['<tool_call>{"name": "search", "arguments": {broken</tool_call>'] + [
        tk.format_tool_call(s["name"], s["arguments"]) if s["kind"] == "tool_call" else s["text"] for s in g]
    engine = ScriptedEngine(tok, replies)
    with ServerThread(create_app(engine, tok)) as server:
        traj = run_chat_episode(OpenAIChatPlanner(server.url + "/v1"), make_env("sandbox"), task, max_turns=8).trajectory()
    first = traj.steps[0]
    assert first.feedback.error_code == ErrorCode.INVALID_ARGUMENTS and "could not be parsed" in first.feedback.message
    assert first.feedback.hint and traj.verification.success and not traj.infra_failure


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "sleep":
            time.sleep(3)
        body = b"internal error" if self.mode == "500" else b"<html>not json</html>"
        self.send_response(500 if self.mode == "500" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):  # quiet
        pass


def _serve(mode):
    handler = type("H", (_Handler,), {"mode": mode})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.handle_error = lambda *a: None  # the timed-out client hangs up mid-reply: expected here
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("mode,code,words", [("500", ErrorCode.INFRA, "HTTP 500"), ("garbage", ErrorCode.INFRA, "not an OpenAI chat"),
                                             ("sleep", ErrorCode.TIMEOUT, "did not answer")])
def test_backend_failures_become_infra_feedback_not_crashes(tasks, mode, code, words):
    srv = _serve(mode)
    try:
        planner = OpenAIChatPlanner(f"http://127.0.0.1:{srv.server_address[1]}/v1", timeout_s=0.5, retries=1)
        reply = planner.respond([{"role": "user", "content": "hi"}], None)
        assert reply.error is not None and reply.error.error_code == code and words in reply.error.message
        traj = run_chat_episode(planner, make_env("sandbox"), tasks[0], max_turns=8).trajectory()
        assert traj.infra_failure and traj.finish_reason == "infra" and traj.verification.infra_error
    finally:
        srv.shutdown()


def test_backend_down_is_infra():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    reply = OpenAIChatPlanner(f"http://127.0.0.1:{port}/v1", timeout_s=2, retries=0).respond([{"role": "user", "content": "x"}], None)
    assert reply.error.error_code == ErrorCode.INFRA and "unreachable" in reply.error.message


def test_engine_backend_keeps_sampled_ids_and_engine_errors_are_infra(tok, tasks):
    task = tasks[0]
    engine = ScriptedEngine(tok, _gold_script(tok, tasks))
    planner = EnginePlanner(engine, tok, max_new_tokens=256, params_cls=SamplingParams, engine_errors=(EngineError,))
    session = HarnessSession(HarnessConfig.defaults(enabled=True))
    traj = run_chat_episode(planner, session.env_factory(), task, max_turns=8).trajectory(session.version_label)
    assert traj.verification.success
    turns = traj.provenance["turns"]
    assert len(turns) == len(task.gold) and all(t["token_ids"] and len(t["token_ids"]) == len(t["logprobs"]) for t in turns)
    assert tok.decode(turns[0]["prompt_ids"]).endswith("<|im_start|>assistant\n")

    class Broken:
        weight_version = "x"

        def generate(self, *a, **k):
            raise EngineError("server gone")

    reply = EnginePlanner(Broken(), tok, params_cls=SamplingParams, engine_errors=(EngineError,)).respond([{"role": "user", "content": "x"}], None)
    assert reply.infra and "server gone" in reply.error.message


def test_scripted_planner_drives_an_episode(tasks):
    task = tasks[0]
    texts = [tk.format_tool_call(s["name"], s["arguments"]) if s["kind"] == "tool_call" else s["text"] for s in task.gold]
    traj = run_chat_episode(ScriptedPlanner(texts), make_env("sandbox"), task, max_turns=8).trajectory()
    assert traj.verification.success


def test_sglang_backend_is_the_engine_planner_over_the_sglang_client(tok, tasks):
    """The SGLang backend = EnginePlanner over `SGLangEngine` (native /generate, token-in/token-out),
    here against `mpa serve`'s SGLang-native subset over loopback (a real SGLang server needs a GPU)."""
    from mpa_jax.rollout.sglang import SGLangEngine

    engine = ScriptedEngine(tok, _gold_script(tok, tasks))
    with ServerThread(create_app(engine, tok)) as server:
        client = SGLangEngine(server.url, timeout_s=30, max_retries=0)
        session = HarnessSession(HarnessConfig.defaults(enabled=True, tools="catalog"))
        traj = run_chat_episode(EnginePlanner(client, tok, params_cls=SamplingParams, engine_errors=(EngineError,)), session.env_factory(), tasks[1],
                                max_turns=8).trajectory(session.version_label)
    assert traj.verification.success and traj.provenance["harness_version"] == "0.1.0"
    assert all(len(t["token_ids"]) == len(t["logprobs"]) > 0 for t in traj.provenance["turns"])
