"""MCP servers as harness tools: a real server written with the official `mcp` SDK (tests/data/
mcp_calc_server.py) started over stdio; registry listing, calls, allow-list, crash -> INFRA + restart,
routing inside an episode, and the `mpa harness tools/call` commands as subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
    with pytest.raises(MCPStartError, match="did not start"):
        MCPServerTools([sys.executable, "-c", "import sys; sys.exit(1)"], timeout_s=10)


def test_mcp_tools_are_offered_and_routed_inside_an_episode(calc):
    session = HarnessSession(HarnessConfig(enabled=True), providers=[calc])
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
