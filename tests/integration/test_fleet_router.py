"""RL through the real sglang-router (PyPI `sglang-router`, the Rust load balancer) in front of two `mpa serve`
worker processes on loopback: the path a user with more than one server takes.

Nothing is mocked. The workers are `mpa serve` processes rather than SGLang servers (SGLang itself needs a
GPU install; `bench/sglang_cpu.py` checks the client against a real SGLang server on CPU). Checked: the
router learns the model from the workers' `/server_info`; both workers serve a step's rollouts; after
every sync each worker in rotation reports the step's weight version; a worker killed while it has
requests in flight (frozen at the step boundary, killed once step 1's requests flow) gives infra episodes, which are re-run or dropped and never trained on, the weight
sync after the step takes the dead worker out of the router's rotation, and the run goes on with the
other worker.

The router runs with `--disable-retries` and the client with `sglang_max_retries=0`: by default both
retry a failed request (the router on another worker), which hides a dead worker's in-flight requests
(docs/scaling.md); here the failure path itself is under test. `--policy round_robin` so that both
workers get requests whatever the prompts; `--cb-failure-threshold 2` so the router stops sending to the
dead worker after two failures; health checks are effectively off, so it is this client's sync, not
the router's checker, that removes the dead worker. No timing is asserted; timeouts only bound waits.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import jax
import pytest

import sglang_router  # noqa: F401  (the test extra; a missing install must fail, not skip)

from mpa_jax import models
from mpa_jax import tokenizer as tk
from mpa_jax.config import load_config_file
from mpa_jax.rl.trainer import run_rl
from mpa_jax.sft.synthetic import tiny_test_config

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UP_S = 180.0  # liveness bound for a process to come up on a loaded CI machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ok, procs, timeout_s: float = UP_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ok():
                return
        except (httpx.TransportError, ValueError, KeyError):
            pass
        for p, log in procs:
            assert p.poll() is None, f"{what}: a process exited:\n{open(log).read()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f}s"
        time.sleep(0.2)


def _router_workers(router: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router + "/workers", timeout=10).json()["workers"]}


def _served(log: str) -> int:
    """`POST /generate` requests a worker answered (uvicorn's access log)."""
    with open(log, encoding="utf-8", errors="replace") as f:
        return sum('"POST /generate HTTP/1.1" 200' in line for line in f)


def _version(url: str) -> str:
    return str(httpx.get(url + "/model_info", timeout=10).json()["weight_version"])


@pytest.fixture()
def fleet(tmp_path):
    """Two `mpa serve` workers on the same start weights and sglang-router in front of them."""
    tok = tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
    c = tiny_test_config(load_config_file(os.path.join(REPO, "configs", "tiny.py")))
    c.model.vocab_size, c.model.max_position_embeddings = tok.vocab_size, 1024
    mcfg = models.config_from_ml(c.model)
    start = str(tmp_path / "start")
    params = models.registry.family_module(mcfg.family).init_params(mcfg, jax.random.key(9))
    models.save_pretrained(models.Model(mcfg, params), start, dtype="float32")
    tok.save(start)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONUNBUFFERED="1")
    procs, urls = [], []
    try:
        for i in range(2):
            port, log = _free_port(), str(tmp_path / f"worker{i}.log")
            cmd = [sys.executable, "-m", "mpa_jax.cli", "serve", "--config", os.path.join(REPO, "configs", "tiny.py"),
                   "--workdir", str(tmp_path / f"w{i}"), "--checkpoint", start, "--port", str(port),
                   "--config.rollout.replicas=1", "--config.serve.slot_len=1024", "--config.serve.max_batch=8"]
            procs.append((subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT), log))
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            _wait(f"mpa serve at {u}", lambda u=u: httpx.get(u + "/health", timeout=2).status_code == 200, procs)
        port, log = _free_port(), str(tmp_path / "router.log")
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls, "--host", "127.0.0.1",
               "--port", str(port), "--policy", "round_robin", "--disable-retries", "--cb-failure-threshold", "2",
               "--cb-timeout-duration-secs", "3600", "--health-check-interval-secs", "3600", "--log-level", "warn",
               # its metrics listener defaults to port 29000: another router on the machine would collide
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        procs.append((subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT), log))
        router = f"http://127.0.0.1:{port}"
        _wait("sglang-router listing both workers", lambda: sorted(_router_workers(router)) == sorted(urls), procs)
        yield {"tok": tok, "config": c, "start": start, "workers": urls, "router": router, "procs": procs}
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_rl_through_sglang_router_with_a_worker_killed_mid_step(fleet, tmp_path):
    router, (a, b) = fleet["router"], fleet["workers"]
    logs = {a: fleet["procs"][0][1], b: fleet["procs"][1][1]}
    # The router knows the model from the workers' /server_info and their load from /get_load.
    listed = _router_workers(router)
    assert {w["model_id"] for w in listed.values()} == {os.path.basename(fleet["start"])}  # the served name: the checkpoint's
    assert all(w["metadata"]["model_path"] == fleet["start"] for w in listed.values())
    assert all(w["load"] >= 0 for w in httpx.get(router + "/get_loads", timeout=10).json()["workers"])

    c = fleet["config"]
    c.rollout.engine, c.rollout.sglang_url, c.rollout.sglang_max_retries = "sglang", router, 0
    c.rollout.max_total_tokens, c.rollout.max_new_tokens, c.rollout.max_turns, c.rollout.batch_size = 768, 12, 2, 8
    r = c.rl
    r.steps, r.tasks_per_step, r.group_size, r.seq_len, r.templates = 2, 3, 2, 768, "calc.tip_split"
    r.minibatches, r.checkpoint_every, r.infra_retries, r.temperature = 1, 10, 2, 1.0
    # A KL term gives every rollout a gradient, so each step updates and syncs whatever the (untrained)
    # model's successes: the sync after the kill is what must take the dead worker out.
    r.kl_coef = 0.01

    step0_synced, killed = threading.Event(), threading.Event()
    checks: list[dict] = []
    served_step0: dict[str, int] = {}

    def killer() -> None:
        # Mid-step: the worker was frozen at the step boundary (on_step below), so each step-1 request the
        # router sends it hangs there; once the other worker has answered a step-1 request, the round robin
        # has sent this one its share, and it dies with them in flight. (Without the freeze a tiny model
        # answers in milliseconds and a kill could fall between requests.) Either way, every later request
        # routed to it fails too, until the router's circuit breaker stops sending.
        if not step0_synced.wait(timeout=600):
            return
        deadline = time.monotonic() + 300
        while _served(logs[a]) <= served_step0[a] and time.monotonic() < deadline:
            time.sleep(0.01)
        fleet["procs"][1][0].send_signal(signal.SIGKILL)
        killed.set()

    def on_step(done, metrics, state, engine):
        v = str(int(metrics["rl/weight_version"]))
        in_rotation = sorted(_router_workers(router))
        checks.append({"done": done, "version": v, "rotation": in_rotation, "engine_live": sorted(engine.live_workers()),
                       "versions": {u: _version(u) for u in in_rotation}, "failed_rows": engine.failed_rows,
                       "events": list(engine.events), "engine_version": engine.weight_version})
        if done == 1:
            served_step0.update({u: _served(logs[u]) for u in (a, b)})
            fleet["procs"][1][0].send_signal(signal.SIGSTOP)
            step0_synced.set()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    res = run_rl(c, str(tmp_path / "run"), init=fleet["start"], tokenizer=fleet["tok"], on_step=on_step, progress=False)
    thread.join(timeout=5)

    assert res.steps == 2 and killed.is_set(), "the worker was not killed during step 1"
    first, second = checks
    # Step 0: both workers served rollouts through the router; the sync put both on the new version.
    assert served_step0[a] > 0 and served_step0[b] > 0, served_step0
    assert first["version"] == "1" and first["rotation"] == sorted([a, b]) == first["engine_live"]
    assert first["versions"] == {a: "1", b: "1"} and first["failed_rows"] == 0
    # Step 1: the killed worker's requests failed -> infra episodes; the sync took it out of rotation
    # (the router no longer lists it) and the other worker is on the new version.
    assert second["failed_rows"] > 0
    assert second["version"] == "2" == second["engine_version"]
    assert second["rotation"] == [a] == second["engine_live"] and second["versions"] == {a: "2"}
    (event,) = second["events"]
    assert b in event and "failed to load weights 2" in event and "1 of 2 workers left" in event
    # Infra episodes are never trained on: the step's trained rollouts hold none (re-run or dropped).
    step2 = res.history[-1]
    with open(tmp_path / "run" / "rollouts" / "step_000002.jsonl", encoding="utf-8") as f:
        trained = [json.loads(line) for line in f if line.strip()]
    assert len(trained) + step2["rl/infra_dropped"] == 6 and len(trained) == step2["rl/rollouts"]
    assert not any(t.get("infra_failure") for t in trained)
    assert all(set(t["provenance"]["weight_versions"]) == {"1"} for t in trained)  # step 1 sampled only version 1
    # The run went on with the other worker: it answered requests after the kill.
    assert _served(logs[a]) > served_step0[a]
