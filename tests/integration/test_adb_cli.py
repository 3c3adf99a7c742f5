"""`mpa device emulate|call` and `mpa oracle --env adb --device SERIAL` through the REAL adb server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.server import AdbServer, free_port
from mpa_jax.envs.contract import Trajectory, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def adb():
    with AdbServer() as srv, EmulatedDevice() as dev:
        srv.connect(dev.serial)
        yield srv, dev


def _mpa(*args, workdir):
    from mpa_jax.cli import main

    return main([*args, "--workdir", str(workdir)])


def test_device_call_prints_feedback_json(adb, tmp_path, capsys):
    srv, dev = adb
    rc = _mpa("device", "call", "--device", dev.serial, "--adb-port", str(srv.port), "--tool", "search_contacts",
              "--args", json.dumps({"query": "a"}), workdir=tmp_path)
    out = capsys.readouterr().out
    assert rc == 0
    fb = json.loads(out)
    assert fb["status"] == "ok" and isinstance(fb["result"], dict)
    # --no-reset continues the same episode: a bad argument is the policy's error, not infra; error
    # Feedback exits 1, as `mpa harness call` does
    rc = _mpa("device", "call", "--device", dev.serial, "--adb-port", str(srv.port), "--tool", "search_contacts",
              "--args", json.dumps({"query": 3}), "--no-reset", workdir=tmp_path)
    assert rc == 1 and json.loads(capsys.readouterr().out)["error_code"] == "INVALID_ARGUMENTS"


def test_device_call_user_errors(adb, tmp_path, capsys):
    srv, dev = adb
    assert _mpa("device", "call", "--device", dev.serial, "--tool", "x", "--args", "{bad", workdir=tmp_path) == 2
    assert "--args is not valid JSON" in capsys.readouterr().err
    # an unknown tool is the device's answer (UNKNOWN_TOOL Feedback, exit 1), as in `mpa harness call`
    assert _mpa("device", "call", "--device", dev.serial, "--adb-port", str(srv.port), "--tool", "no_such_tool",
                workdir=tmp_path) == 1
    assert json.loads(capsys.readouterr().out)["error_code"] == "UNKNOWN_TOOL"
    assert _mpa("device", "call", "--device", dev.serial, "--adb-port", str(srv.port), "--tool", "get_contact",
                "--task", "no-such-task", workdir=tmp_path) == 2
    assert "no task 'no-such-task' in split test" in capsys.readouterr().err
    assert _mpa("device", "call", "--device", dev.serial, "--adb-port", str(srv.port), "--tool", "get_contact",
                "--task", "x", "--no-reset", workdir=tmp_path) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert _mpa("oracle", "--env", "adb", workdir=tmp_path) == 2
    assert "--env adb needs --device" in capsys.readouterr().err
    assert _mpa("rollout", "--config.envs.kind=simulated", workdir=tmp_path) == 2
    assert "refuses simulated episodes" in capsys.readouterr().err


def test_oracle_on_the_device(adb, tmp_path):
    from mpa_jax.data import oracle_dataset

    srv, dev = adb
    c = load_config_file(os.path.join(ROOT, "configs/tiny.py"))
    c.tokenizer.vocab_size = 1024
    c.tokenizer.corpus_tasks = 20
    c.oracle.variants = 1
    c.envs.kind, c.envs.adb.device, c.envs.adb.adb_port = "adb", dev.serial, srv.port
    path, _, _ = oracle_dataset(c, str(tmp_path), split="test", max_tasks=4, progress=False)
    trajs = read_jsonl(path, Trajectory)
    assert len(trajs) == 4
    assert all(t.provenance["env"] == "adb" and t.verification.success and not t.infra_failure for t in trajs)


def test_mpa_device_emulate_serves_the_real_adb_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*MPA, "device", "emulate", "--port", str(port), "--workdir", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert f"127.0.0.1:{port}" in proc.stdout.readline()
        with AdbServer() as srv:
            srv.connect(f"127.0.0.1:{port}")
            out = srv.run("-s", f"127.0.0.1:{port}", "shell", "getprop", "ro.product.model").stdout
            assert out.strip() == "MPA Emulated Device"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_bench_adb_prints_its_figures():
    out = subprocess.run([sys.executable, "bench/adb.py", "--episodes", "3", "--echoes", "5"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "episodes/s, success 3/3" in out.stdout and "mean command latency" in out.stdout
