"""`--mcp mcp-server-time` finds the script in the running interpreter's environment (a venv's bin)
when that bin is not on PATH, as under a not-activated venv (`.venv/bin/mpa ...`). The server is the
real one from setup.py's `test` extra."""
import json
import os
import subprocess
import sys

from mpa_jax.harness.mcp import resolve_executable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def test_bare_names_resolve_in_the_interpreters_bin_first():
    assert resolve_executable(["mcp-server-time", "--x"]) == [os.path.join(BIN, "mcp-server-time"), "--x"]
    assert resolve_executable(["/bin/echo", "hi"]) == ["/bin/echo", "hi"]  # a path stays as given
    assert resolve_executable(["no-such-mcp-server-xyz"]) == ["no-such-mcp-server-xyz"]  # left to PATH (and its error)


def test_cli_finds_the_server_without_the_venv_on_path(tmp_path):
    env = dict(os.environ, PATH="/usr/bin:/bin")  # no venv bin: the lookup must come from sys.executable
    assert not any(os.path.exists(os.path.join(d, "mcp-server-time")) for d in env["PATH"].split(":"))
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "tools", "--mcp", "mcp-server-time", "--json",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "get_current_time" in {t["name"] for t in json.loads(out.stdout)}
