"""Device faults through the REAL adb server: a frozen device (`kill -STOP` on the emulated device's own
process, `mpa device emulate`), a restarted one, a dead one under a long `mpa oracle` run, and `mpa device
call`'s catalog episode and exit codes.

The emulated device mostly runs in its own process here because freezing and killing must hit the process
that holds the device's sockets, exactly as a user does it. Hang guards (`timeout=` of a subprocess or a thread
join) are many times the configured command timeout: they tell "returns" from "never returns" and are
not timing assertions.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from mpa_jax.envs import Action, ErrorCode, load_tasks, run_oracle_episode
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.env import AdbEnv, DeviceUnavailable
from mpa_jax.envs.adb.server import AdbServer, free_port
from mpa_jax.envs.base import EnvUnavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]
GUARD_S = 120  # hang guard: the code under test answers within a few command timeouts of 2 s


class Device:
    """`mpa device emulate --port PORT` as a child process, which tests freeze, kill and start again."""

    def __init__(self, tmp_path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.tmp_path = tmp_path
        self.proc: subprocess.Popen | None = None

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Device":
        self.proc = subprocess.Popen([*MPA, "device", "emulate", "--port", str(self.port), "--workdir", str(self.tmp_path)],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert self.serial in line, line
        return self

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture()
def adb_server():
    with AdbServer() as srv:
        yield srv


@pytest.fixture()
def device(tmp_path):
    dev = Device(tmp_path).start()
    yield dev
    dev.kill()


def _task(tool: str = "search_contacts"):
    return next(t for t in load_tasks("test") if tool in t.tools)


def _mpa(*args, tmp_path, timeout=GUARD_S):
    return subprocess.run([*MPA, *args, "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_frozen_device_step_is_timeout_then_infra(adb_server, device):
    adb_server.connect(device.serial)
    env = AdbEnv(device.serial, adb_port=adb_server.port, command_timeout_s=2.0)
    env.reset(_task())
    device.freeze()
    out = {}
    worker = threading.Thread(target=lambda: out.update(fb=env.step(Action.tool_call("search_contacts", {"query": "Alex"}))),
                              daemon=True)
    worker.start()
    worker.join(GUARD_S)  # before the fix the OPEN's OKAY never came and adbutils waited 600 s
    try:
        assert not worker.is_alive(), "a step on a frozen device never returned"
        fb = out["fb"]
        assert fb.error_code == ErrorCode.TIMEOUT and fb.is_infra and "command_timeout_s" in fb.message
        assert env.step(Action.finish()).error_code == ErrorCode.INFRA  # the episode stays infra
        assert env.verify().infra_error
    finally:
        device.thaw()
    ep = run_oracle_episode(env, _task(), seed=0)  # thawed: the next reset reconnects and the episode runs
    assert ep.verification.success and env.reconnects == 1


def test_mpa_device_call_on_a_frozen_device_returns(adb_server, device, tmp_path):
    adb_server.connect(device.serial)
    base = ["device", "call", "--device", device.serial, "--adb-port", str(adb_server.port),
            "--config.envs.adb.command_timeout_s=2", "--config.envs.adb.reconnect_attempts=1"]
    first = _mpa(*base, "--tool", "search_contacts", "--args", '{"query": "Alex"}', tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    device.freeze()
    try:
        # continuing the episode: the step's TIMEOUT Feedback, exit 1 like any error Feedback
        cont = _mpa(*base, "--no-reset", "--tool", "search_contacts", "--args", '{"query": "Alex"}', tmp_path=tmp_path)
        assert cont.returncode == 1, cont.stderr
        assert json.loads(cont.stdout)["error_code"] == "TIMEOUT"
        # a new episode: the reset's timeout is one line naming the device, exit 2
        fresh = _mpa(*base, "--tool", "search_contacts", "--args", '{"query": "Alex"}', tmp_path=tmp_path)
        assert fresh.returncode == 2 and fresh.stderr.count("\n") == 1
        assert device.serial in fresh.stderr and "command_timeout_s" in fresh.stderr
    finally:
        device.thaw()


def _refuse_next_connection(port: int, timeout_s: float) -> None:
    """Listen on the device's port until the adb server's next connection attempt arrives, then close it
    unanswered: that attempt has happened, and failed, by the time this returns (a wait on the event, with
    `timeout_s` as the hang guard, instead of a fixed sleep)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        listener.settimeout(timeout_s)
        conn, _ = listener.accept()  # socket.timeout (a test error) if the server never tries again
        conn.close()


def test_restarted_device_is_reconnected_at_once(adb_server):
    """A device killed and started again on its port. The adb server retries once by itself soon after the
    device drops (measured: ~0.6 s; that try fails while the device is down), then only every ~10 s, and
    `adb connect` answers "already connected" for the offline serial meanwhile: with 0.35 s of backoff in
    all, only disconnect + connect brings the restarted device back. The device runs in this process so
    that it is back within milliseconds once the server's own retry has been seen to fail (a listener on the
    device's port takes that retry and closes it); stopping it closes every socket it holds, which is what
    the adb server sees of a killed device process."""
    dev = EmulatedDevice().start()
    port = dev.port
    adb_server.connect(dev.serial)
    env = AdbEnv(dev.serial, adb_port=adb_server.port, command_timeout_s=5.0, reconnect_attempts=4, backoff_s=0.05)
    task = _task()
    try:
        env.reset(task)
        dev.stop()
        fb = env.step(Action.tool_call("search_contacts", {"query": "Alex"}))
        assert fb.error_code == ErrorCode.INFRA
        assert f"{dev.serial}\toffline" in adb_server.run("devices").stdout
        _refuse_next_connection(port, timeout_s=GUARD_S)  # the server's own retry came and failed
        dev = EmulatedDevice(port).start()  # the device is up again
        ep = run_oracle_episode(env, task, seed=0)
        assert ep.verification.success and env.reconnects == 1
        assert f"{dev.serial}\tdevice" in adb_server.run("devices").stdout
    finally:
        dev.stop()


def test_dead_device_raises_env_unavailable(adb_server, device):
    adb_server.connect(device.serial)
    env = AdbEnv(device.serial, adb_port=adb_server.port, command_timeout_s=2.0, reconnect_attempts=2, backoff_s=0.01)
    env.reset(_task())
    device.kill()
    with pytest.raises(EnvUnavailable, match="not online after 2 reconnect attempts") as info:
        env.reset(_task())
    assert isinstance(info.value, DeviceUnavailable) and "Connection refused" in str(info.value)


def test_oracle_run_on_a_dead_device_stops_at_once(adb_server, device, tmp_path):
    adb_server.connect(device.serial)
    device.kill()
    out = _mpa("oracle", "--env", "adb", "--device", device.serial, "--split", "test", "--max-tasks", "300",
               f"--config.envs.adb.adb_port={adb_server.port}", "--config.envs.adb.reconnect_attempts=2",
               "--config.tokenizer.vocab_size=1024", "--config.tokenizer.corpus_tasks=20", tmp_path=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert device.serial in out.stderr and "stopped after 0 of 300 tasks" in out.stderr
    assert "infra" not in out.stdout  # no per-task infra lines: the run stopped on the first reset
    assert not os.path.exists(tmp_path / "oracle-test.jsonl")


def test_device_call_offers_the_whole_catalog_across_no_reset(adb_server, device, tmp_path):
    adb_server.connect(device.serial)
    base = ["device", "call", "--device", device.serial, "--adb-port", str(adb_server.port)]
    made = _mpa(*base, "--tool", "create_note", "--args", '{"title": "groceries", "body": "milk"}', tmp_path=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    note = json.loads(made.stdout)["result"]
    found = _mpa(*base, "--no-reset", "--tool", "search_notes", "--args", '{"query": "groceries"}', tmp_path=tmp_path)
    assert found.returncode == 0, found.stdout  # before: UNKNOWN_TOOL (the first call's task lacked search_notes)
    assert note["id"] in found.stdout
    # docs/devices.md's example
    got = _mpa(*base, "--no-reset", "--tool", "get_contact", "--args", '{"id": "contact_3"}', tmp_path=tmp_path)
    assert got.returncode == 0 and json.loads(got.stdout)["result"]["id"] == "contact_3"
    # an error Feedback exits 1 (as `mpa harness call`)
    bad = _mpa(*base, "--no-reset", "--tool", "get_contact", "--args", '{"id": "contact_99999"}', tmp_path=tmp_path)
    assert bad.returncode == 1 and json.loads(bad.stdout)["error_code"] == "NOT_FOUND"
