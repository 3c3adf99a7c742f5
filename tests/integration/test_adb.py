"""ADB device env: whole episodes through the REAL adb server (Debian `adb`) and adbutils to the emulated
device (`mpa_jax.envs.adb.emulator`, which speaks the adbd wire protocol over loopback TCP)."""
from __future__ import annotations

import collections
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpa_jax.envs import Action, ErrorCode, load_tasks, make_env, run_oracle_episode
from mpa_jax.envs.adb.device import DeviceShell
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.env import AdbEnv, parse_rows, quote_argv
from mpa_jax.envs.adb.server import AdbServer

HOSTILE = [
    "; rm -rf /",
    "`reboot`",
    "$(rm -rf /data)",
    "it's a \"quote\" and 'another'",
    "line one\nline two; rm -rf /\n",
    "ünïcødé — 日本語 🚀",
    "back\\slash $HOME $? && || | & > /dev/null < x",
    "'; rm -rf / #",
]


@pytest.fixture(scope="module")
def adb():
    with AdbServer() as srv:
        dev = EmulatedDevice().start()
        srv.connect(dev.serial)
        yield srv, dev
        dev.stop()


@pytest.fixture()
def env(adb):
    srv, dev = adb
    dev.shell.delay_s, dev.shell.corrupt_output = 0.0, False
    e = AdbEnv(dev.serial, adb_port=srv.port, command_timeout_s=5.0)
    yield e
    e.close()


def _sample_tasks():
    """One test task per (domain, category): every kind of task, the follow-up conversations included (the
    device's companion answers a reply with the user's next turn, as the sandbox does)."""
    seen, out = set(), []
    for t in load_tasks("test"):
        if (t.domain, t.category) not in seen:
            seen.add((t.domain, t.category))
            out.append(t)
    return out


def test_devices_listed_by_the_real_adb_server(adb):
    srv, dev = adb
    listed = srv.run("devices", "-l").stdout
    assert f"{dev.serial}" in listed and "device product:mpa_emu" in listed
    assert srv.run("-s", dev.serial, "shell", "echo", "hello").stdout == "hello\n"


def test_oracle_episodes_on_the_device_match_the_sandbox(env):
    tasks = _sample_tasks()
    assert len(tasks) >= 40
    sandbox = make_env("sandbox")
    outcomes = collections.Counter()
    for task in tasks:
        on_device = run_oracle_episode(env, task, seed=3)
        local = run_oracle_episode(sandbox, task, seed=3)
        assert on_device.verification.success, (task.id, on_device.verification)
        assert on_device.verification.score == local.verification.score
        assert [s.feedback.to_dict() if s.feedback else None for s in on_device.steps] == \
               [s.feedback.to_dict() if s.feedback else None for s in local.steps]
        outcomes[task.category] += 1
    assert set(outcomes) == {"tool_use", "memory", "skills", "subagent", "followup"}
    assert env.commands > 4 * len(tasks)


def test_doing_nothing_fails_on_the_device(env):
    task = next(t for t in _sample_tasks() if t.verifier.get("goals"))
    env.reset(task)
    v = env.verify()
    assert not v.success and not v.infra_error


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_arguments_arrive_as_literal_data(adb, env, text):
    _, dev = adb
    task = next(t for t in load_tasks("test") if "create_note" in t.tools)
    env.reset(task)
    before = len(dev.shell.executed)
    fb = env.step(Action.tool_call("create_note", {"title": text, "body": text + "!"}))
    assert fb.ok, fb
    ran = dev.shell.executed[before:]
    # `content call` plus adbutils' exit-status echo, nothing else: no rm, no reboot, no split commands
    assert [argv[0] for argv in ran] == ["content", "echo"], ran
    assert json.loads(ran[0][-1])["arguments"] == {"title": text, "body": text + "!"}
    state = env.read_state({"notes_notes"})["notes_notes"]
    row = state[fb.result["id"]] if isinstance(fb.result, dict) and "id" in fb.result else None
    assert row is not None and row["title"] == text and row["body"] == text + "!"
    assert env.shell(["echo", text]) == text + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
                min_size=1, max_size=4))
def test_any_quoted_argv_arrives_verbatim(adb, env, words):
    """Property: through the real adb server, the device runs exactly one command whose words are ours."""
    _, dev = adb
    before = len(dev.shell.executed)
    env.shell(["echo", *words])
    assert dev.shell.executed[before] == ["echo", *words]
    assert [argv[0] for argv in dev.shell.executed[before:]] == ["echo", "echo"]  # ours + adbutils' exit status


def test_nul_bytes_are_refused_before_the_device():
    with pytest.raises(ValueError, match="NUL"):
        quote_argv(["echo", "a\x00b"])


def test_the_emulated_shell_would_run_unquoted_input():
    """The control: without quoting, the device shell really interprets the hostile text."""
    dev = DeviceShell()
    dev.run("echo " + "; rm -rf /")
    assert ["rm", "-rf", "/"] in dev.executed
    dev.executed.clear()
    dev.run("echo $(reboot) `id`")
    assert ["reboot"] in dev.executed and ["id"] in dev.executed
    dev.executed.clear()
    out, _ = dev.run(quote_argv(["echo", "$(reboot) `id`; rm -rf /"]))
    assert dev.executed == [["echo", "$(reboot) `id`; rm -rf /"]] and out == "$(reboot) `id`; rm -rf /\n"


def test_content_settings_am_input_dumpsys_formats(adb, env):
    srv, dev = adb
    task = next(t for t in load_tasks("test") if "create_note" in t.tools)
    env.reset(task)
    uri = "content://com.mpa.agent/state/notes_notes"
    env.shell(["content", "insert", "--uri", uri, "--bind", "title:s:it's, odd", "--bind", "pinned:b:true"])
    rows = parse_rows(env.shell(["content", "query", "--uri", uri]))
    new = [r for r in rows if r["title"] == "it's, odd"]
    assert len(new) == 1 and new[0]["pinned"] is True
    rid = new[0]["id"]
    where = "id='" + rid.replace("'", "''") + "'"
    env.shell(["content", "update", "--uri", uri, "--bind", "body:s:x", "--where", where])
    assert parse_rows(env.shell(["content", "query", "--uri", uri, "--where", where, "--projection", "id:body"])) == \
           [{"id": rid, "body": "x"}]
    env.shell(["content", "delete", "--uri", uri, "--where", where])
    assert env.shell(["content", "query", "--uri", uri, "--where", where]).strip() == "No result found."
    env.shell(["settings", "put", "global", "wifi", "false"])
    assert env.shell(["settings", "get", "global", "wifi"]).strip() == "false"
    assert env.shell(["settings", "get", "global", "no_such_key"]).strip() == "null"
    assert "level: " in env.shell(["dumpsys", "battery"])
    assert env.battery_level() == dev.shell.env.world.device["battery"]
    assert env.read_state({"device"})["device"]["battery"] == {"value": dev.shell.env.world.device["battery"]}
    assert env.shell(["am", "start", "-a", "android.intent.action.VIEW", "-d", "https://x.y"]).startswith(
        "Starting: Intent { act=android.intent.action.VIEW dat=https://x.y }")
    env.shell(["input", "text", "hello world"])
    assert dev.shell.inputs[-1] == ["text", "hello world"]


def _task():
    return next(t for t in _sample_tasks() if t.category == "tool_use" and len(t.gold) >= 2)


def test_disconnect_mid_episode_is_infra_then_reconnects(adb, env):
    srv, dev = adb
    task = _task()
    env.reset(task)
    dev.drop_connections()
    fb = env.step(Action.tool_call(task.gold[0]["name"], task.gold[0].get("arguments", {})))
    assert fb.error_code == ErrorCode.INFRA and fb.is_infra
    assert env.step(Action.finish()).error_code == ErrorCode.INFRA  # the episode stays infra
    v = env.verify()
    assert v.infra_error and not v.success and v.score == 0.0
    ep = run_oracle_episode(env, task, seed=0)  # reset reconnects (adb connect with backoff)
    assert ep.verification.success and env.reconnects >= 1


def test_adb_server_restart_mid_episode_is_infra_then_recovers(adb, env):
    srv, dev = adb
    task = _task()
    env.reset(task)
    srv.kill()
    fb = env.step(Action.tool_call(task.gold[0]["name"], task.gold[0].get("arguments", {})))
    assert fb.error_code == ErrorCode.INFRA
    assert env.verify().infra_error
    ep = run_oracle_episode(env, task, seed=0)  # reset starts the server again and reconnects the device
    assert ep.verification.success
    assert dev.serial in srv.run("devices").stdout


def test_command_timeout_is_timeout_feedback(adb, env):
    srv, dev = adb
    task = _task()
    env.reset(task)
    env.command_timeout_s = 0.3
    dev.shell.delay_s = 1.0
    try:
        fb = env.step(Action.tool_call(task.gold[0]["name"], task.gold[0].get("arguments", {})))
    finally:
        dev.shell.delay_s = 0.0
    assert fb.error_code == ErrorCode.TIMEOUT and fb.is_infra
    assert env.verify().infra_error  # the late write on the device is never scored


def test_unexpected_output_is_infra(adb, env):
    srv, dev = adb
    task = _task()
    env.reset(task)
    dev.shell.corrupt_output = True
    try:
        fb = env.step(Action.tool_call(task.gold[0]["name"], task.gold[0].get("arguments", {})))
    finally:
        dev.shell.corrupt_output = False
    assert fb.error_code == ErrorCode.INFRA and "unexpected" in fb.message
    assert env.verify().infra_error


def test_unknown_device_is_a_clear_fault(adb):
    srv, _ = adb
    from mpa_jax.envs.adb.env import DeviceFault

    env = AdbEnv("127.0.0.1:1", adb_port=srv.port, reconnect_attempts=2, backoff_s=0.01, start_server=False)
    with pytest.raises(DeviceFault, match="not online"):
        env.reset(_task())
