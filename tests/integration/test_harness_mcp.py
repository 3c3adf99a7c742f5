"""MCP servers as harness tools: a real server written with the official `mcp` SDK (tests/data/
mcp_calc_server.py) started over stdio; registry listing, calls, allow-list, crash -> INFRA + restart,
routing inside an episode, and the `mpa harness tools/call` commands as subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs import Action, ErrorCode, load_tasks
from mpa_jax.harness import HarnessConfig, HarnessSession
from mpa_jax.harness.mcp import MCPServerTools, MCPStartError
from mpa_jax.harness.registry import RegistryError, SandboxTools, ToolRegistry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = [sys.executable, os.path.join(REPO, "tests", "data", "mcp_calc_server.py")]


@pytest.fixture(scope="module")
def calc():
    server = MCPServerTools(SERVER, timeout_s=20)
    yield server
    server.close()


def test_registry_lists_mcp_tools_with_schema_and_source(calc):
    reg = ToolRegistry([SandboxTools(), calc])
    rows = {r["name"]: r for r in reg.describe()}
    assert len(rows) == 257 + 4
    assert rows["add"]["source"] == "mcp:mcp_calc_server" and rows["add"]["parameters"]["required"] == ["a", "b"]
    assert rows["search_contacts"]["source"] == "sandbox"
    with pytest.raises(RegistryError, match="'add'"):
        reg.add_provider(MCPLike())


class MCPLike:
    source = "mcp:other"

    def specs(self):
        from mpa_jax.envs.contract import ToolSpec

        return [ToolSpec(name="add", app="x", domain="utilities", description="clash", parameters={"type": "object"})]

    def call(self, name, args):
        raise AssertionError


def test_calls_errors_and_restart_after_a_crash(calc):
    fb = calc.call("add", {"a": 2, "b": 3.5})
    assert fb.ok and fb.result == 5.5
    bad = calc.call("add", {"a": "x"})
    assert bad.error_code == ErrorCode.INVALID_ARGUMENTS and bad.hint
    pid1 = calc.call("pid", {}).result
    crashed = calc.call("crash", {})
    assert crashed.error_code == ErrorCode.INFRA and "restarted" in crashed.hint
    fb = calc.call("pid", {})
    assert fb.ok and fb.result != pid1 and calc.restarts >= 1
    assert calc.call("echo", {"text": "still here"}).result == "still here"


def test_allow_list_hides_and_blocks_tools():
    server = MCPServerTools(SERVER, allow={"echo"}, timeout_s=20)
    try:
        assert [s.name for s in server.specs()] == ["echo"]
        fb = server.call("add", {"a": 1, "b": 2})
        assert fb.error_code == ErrorCode.PERMISSION_DENIED
    finally:
        server.close()
    with pytest.raises(MCPStartError, match="exited with code 1 at start"):
        MCPServerTools([sys.executable, "-c", "import sys; sys.exit(1)"], timeout_s=10)


def test_mcp_tools_are_offered_and_routed_inside_an_episode(calc):
    session = HarnessSession(HarnessConfig.defaults(enabled=True), providers=[calc])
    task = next(t for t in load_tasks("dev") if t.category == "tool_use")
    env = session.env_factory()
    obs = env.reset(task)
    names = [t["function"]["name"] for t in obs["tools"]]
    assert {"add", "echo"} <= set(names)
    fb = env.step(Action.tool_call("add", {"a": "1", "b": 2}, "m1"))  # "1": the schema normaliser makes it a number
    assert fb.ok and fb.result == 3.0
    fb = env.step(Action.tool_call("add", {"a": 1}, "m2"))  # validated by the harness before the server sees it
    assert fb.error_code == ErrorCode.INVALID_ARGUMENTS and "required" in fb.hint
    assert env.env.ledger == []  # MCP calls do not touch the sandbox ledger
    env.close()




def test_cli_tools_and_call(tmp_path):
    cmd = " ".join(SERVER)
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "tools", "--mcp", cmd, "--allow", "add,echo", "--json",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    mcp = {r["name"]: r for r in rows if r["source"].startswith("mcp:")}
    assert set(mcp) == {"add", "echo"} and mcp["add"]["parameters"]["properties"]["a"]["type"] == "number"
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "call", "--mcp", cmd, "--tool", "add", "--args",
                          '{"a": 20, "b": 22}', "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"] == 42.0
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "call", "--tool", "convert_units", "--args",
                          '{"value": 10, "from_unit": "km", "to_unit": "mi"}', "--workdir", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO)
    fb = json.loads(out.stdout)
    assert out.returncode == 0 and fb["status"] == "ok" and fb["result"]["unit"] == "mi"
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "call", "--tool", "add", "--args", "{nope",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--args is not valid JSON" in out.stderr


CALCULATE = [sys.executable, os.path.join(REPO, "tests", "data", "mcp_calculate_server.py")]


def _cli(*args, workdir, **kw):
    return subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", *args, "--workdir", str(workdir)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, **kw)


def _gone(pid: int) -> bool:
    """True once `pid` has exited (no process, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_server_that_dies_at_start_says_what_it_printed_and_its_exit_code(tmp_path):
    code = "import sys; print('bad token in config', file=sys.stderr); sys.exit(4)"
    with pytest.raises(MCPStartError) as info:
        MCPServerTools([sys.executable, "-c", code], timeout_s=20)
    msg = str(info.value)
    assert "exited with code 4 at start" in msg and "bad token in config" in msg and "TaskGroup" not in msg
    # the issue's own command line: one --mcp value with quotes inside, one clear line, exit 2
    out = _cli("tools", "--mcp", f"{sys.executable} -c 'import sys; sys.exit(4)'", workdir=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "exited with code 4 at start" in out.stderr and "closing quotation" not in out.stderr


def test_server_that_hangs_at_start_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(3600)"
    with pytest.raises(MCPStartError, match="did not answer the MCP handshake within 2 s .* was killed"):
        MCPServerTools([sys.executable, "-c", code], timeout_s=2)
    pid = int(pidfile.read_text())
    for _ in range(500):  # the event loop reaps it; before the fix it kept sleeping
        if _gone(pid):
            break
        threading.Event().wait(0.02)
    assert _gone(pid), f"the hung server {pid} is still running"


def test_server_stderr_goes_to_the_log_not_the_terminal(tmp_path):
    out = _cli("tools", "--mcp", " ".join(SERVER), "--json", workdir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "ready" not in out.stderr  # before: the server's stderr was the terminal's
    log = (tmp_path / "mcp.log").read_text()
    assert "mcp:mcp_calc_server | mcp_calc_server" in log and "ready" in log
    server = MCPServerTools(SERVER, timeout_s=20, log=str(tmp_path / "other.log"))
    try:
        assert "ready" in server.stderr_tail() and "ready" in (tmp_path / "other.log").read_text()
    finally:
        server.close()


def test_mcp_entries_stay_a_list(tmp_path):
    from mpa_jax.harness.config import HarnessConfigError

    odd = tmp_path / "with;semi colon"
    odd.mkdir()
    script = odd / "srv.py"
    script.write_text(open(SERVER[1]).read())
    # a path with ";" and a space, quoted for shlex: one entry, never split on the ";"
    out = _cli("tools", "--mcp", f"{sys.executable} '{script}'", "--mcp", "name=calc2 prefix=c2_ " + " ".join(SERVER), "--json",
               workdir=tmp_path)
    assert out.returncode == 0, out.stderr
    sources = {r["source"] for r in json.loads(out.stdout)} - {"sandbox"}
    assert sources == {"mcp:srv", "mcp:calc2"}
    # the config override of the list (Python literal, as ml_collections' list fields take it)
    entries = json.dumps([{"command": [sys.executable, str(script)], "name": "calc", "allow": ["echo"]}])
    out = _cli("tools", f"--config.harness.mcp={entries}", "--json", workdir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [r["name"] for r in json.loads(out.stdout) if r["source"] == "mcp:calc"] == ["echo"]
    c = load_config_file(os.path.join(REPO, "configs", "tiny.py"))
    c.harness.mcp = ["python a.py ; rm -rf /"]
    assert HarnessConfig.from_config(c).mcp_servers[0].command == ["python", "a.py", ";", "rm", "-rf", "/"]
    with pytest.raises(HarnessConfigError, match="unknown entry key 'prefx'"):
        HarnessConfig.defaults(mcp=[{"command": ["x"], "prefx": "a_"}])
    out = _cli("tools", "--mcp", "python 'unclosed", workdir=tmp_path)
    assert out.returncode == 2 and "cannot split" in out.stderr and out.stderr.count("\n") == 1


def test_rename_and_prefix_resolve_a_clash_with_the_sandbox_catalog():
    with pytest.raises(MCPStartError, match="rename names 'nope'"):
        HarnessSession(HarnessConfig.defaults(enabled=True, mcp=["rename=nope:x " + " ".join(CALCULATE)]))
    with pytest.raises(RegistryError, match="'calculate' of mcp:mcp_calculate_server is already registered by sandbox.*prefix="):
        HarnessSession(HarnessConfig.defaults(enabled=True, mcp=[" ".join(CALCULATE)]))
    session = HarnessSession(HarnessConfig.defaults(enabled=True, mcp=["rename=calculate:calc_eval " + " ".join(CALCULATE),
                                                              {"command": CALCULATE, "prefix": "m_"}]))
    try:
        reg = session.registry
        assert reg.source("calc_eval") == "mcp:mcp_calculate_server" and reg.source("calculate") == "sandbox"
        assert reg.source("m_calculate") == "mcp:mcp_calculate_server-2"
        task = next(t for t in load_tasks("dev") if "calculate" in t.tools)
        env = session.env_factory()
        obs = env.reset(task)
        offered = [t["function"]["name"] for t in obs["tools"]]
        assert {"calc_eval", "m_calculate", "calculate"} <= set(offered)
        fb = env.step(Action.tool_call("calc_eval", {"expression": "6*7"}, "c1"))
        assert fb.ok and fb.result == "42"  # reached the server under its own name, `calculate`
        fb = env.step(Action.tool_call("m_calculate", {"expression": "2**10"}, "c2"))
        assert fb.ok and fb.result == "1024"
        fb = env.step(Action.tool_call("calculate", {"expression": "6*7"}, "c3"))
        assert fb.ok and isinstance(fb.result, dict)  # the sandbox's own calculate still answers it
        assert [e["name"] for e in env.env.ledger] == ["calculate"]
        env.close()
    finally:
        session.close()


def test_tool_off_the_allow_list_is_permission_denied_everywhere(tmp_path):
    session = HarnessSession(HarnessConfig.defaults(enabled=True, mcp=[" ".join(SERVER)], mcp_allow="echo"))
    try:
        reg = session.registry
        assert "add" not in reg.names() and "add" in reg and reg.is_refused("add")
        env = session.env_factory()
        env.reset(next(t for t in load_tasks("dev") if t.category == "tool_use"))
        fb = env.step(Action.tool_call("add", {"a": 1, "b": 2}, "p1"))
        assert fb.error_code == ErrorCode.PERMISSION_DENIED and "allow-list" in fb.message  # before: UNKNOWN_TOOL
        assert env.step(Action.tool_call("echo", {"text": "hi"}, "p2")).result == "hi"
        env.close()
    finally:
        session.close()
    out = _cli("call", "--mcp", " ".join(SERVER), "--allow", "echo", "--tool", "add", "--args", '{"a": 1, "b": 2}',
               workdir=tmp_path)
    assert out.returncode == 1 and json.loads(out.stdout)["error_code"] == "PERMISSION_DENIED"


def test_harness_call_validates_arguments_like_the_runtime(tmp_path):
    out = _cli("call", "--mcp", " ".join(SERVER), "--tool", "add", "--args", '{"a": 1}', workdir=tmp_path)
    fb = json.loads(out.stdout)
    assert out.returncode == 1 and fb["error_code"] == "INVALID_ARGUMENTS"
    assert "validation error for" not in fb["message"]  # the harness's validator, not the server's pydantic
    assert fb["hint"].startswith("add: ") and "required" in fb["hint"]
    out = _cli("call", "--mcp", " ".join(SERVER), "--tool", "add", "--args", '{"a": "20", "b": 22}', workdir=tmp_path)
    assert out.returncode == 0 and json.loads(out.stdout)["result"] == 42.0  # normalised first, as in an episode


def test_server_errors_keep_the_message_and_the_right_code():
    server = MCPServerTools(SERVER, timeout_s=20)
    try:
        fb = server.call("add", {"a": "x", "b": 1})  # straight to the server: its own validation answers
        assert fb.error_code == ErrorCode.INVALID_ARGUMENTS and "validation error" in fb.message
        fb = server.call("nope", {})
        assert fb.error_code == ErrorCode.UNKNOWN_TOOL and server.restarts == 0
        pid = server.pid
        fb = server.call("crash", {})
        assert fb.error_code == ErrorCode.INFRA and "exited with code 3 during the call" in fb.message
        assert "ready" in fb.message and server.restarts == 1 and server.pid != pid
    finally:
        server.close()
