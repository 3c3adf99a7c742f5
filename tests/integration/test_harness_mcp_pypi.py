"""The official MCP servers from PyPI that users run, through the harness (all in setup.py's `test` extra,
spawned as `sys.executable -m PACKAGE`, which works in any venv `make test` builds):

- mcp-server-time: prefixes for two copies of one server, tool errors that keep the server's message;
- mcp-server-git: the server name from the executable (not `--repository`'s last argument), the result
  cap on a 6 MB staged diff, its digest in the trace;
- mcp-server-fetch: a page served on loopback by this test, and the codes of its failures.

mcp-server-calculator and mcp-server-sqlite are not here: docs/harness.md says why.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from mpa_jax.envs import Action, ErrorCode, load_tasks
from mpa_jax.harness import HarnessConfig, HarnessSession
from mpa_jax.harness.mcp import MCPServerTools
from mpa_jax.harness.registry import RegistryError
from mpa_jax.harness.results import result_text
from mpa_jax.harness.store import HarnessStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIME = [sys.executable, "-m", "mcp_server_time"]
GIT = [sys.executable, "-m", "mcp_server_git"]
FETCH = [sys.executable, "-m", "mcp_server_fetch"]
PAGE = b"<html><head><title>Loopback</title></head><body><h1>Hello from loopback</h1><p>Opening hours: 9-17.</p></body></html>"


def _cli(*args, workdir):
    return subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", *args, "--workdir", str(workdir)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def page_url():
    """One HTML page on 127.0.0.1 (robots.txt: 404, which allows fetching)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/page":
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/page"
    srv.shutdown()


@pytest.fixture()
def repo(tmp_path):
    path = tmp_path / "repo"
    path.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    (path / "README").write_text("hello\n")
    run("add", "README")
    run("commit", "-qm", "first")
    return path


def test_time_server_two_copies_need_a_prefix_and_errors_keep_the_message():
    with pytest.raises(RegistryError, match="'get_current_time' of mcp:mcp_server_time-2 is already registered"):
        HarnessSession(HarnessConfig.defaults(enabled=True, mcp=[" ".join(TIME), " ".join(TIME)]))
    session = HarnessSession(HarnessConfig.defaults(enabled=True, mcp=[" ".join(TIME), {"command": TIME, "prefix": "utc_"}]))
    try:
        reg = session.registry
        assert reg.source("get_current_time") == "mcp:mcp_server_time" and reg.source("utc_convert_time") == "mcp:mcp_server_time-2"
        env = session.env_factory()
        env.reset(next(t for t in load_tasks("dev") if t.category == "tool_use"))
        fb = env.step(Action.tool_call("utc_get_current_time", {"timezone": "Asia/Tokyo"}, "t1"))
        assert fb.ok and fb.result["timezone"] == "Asia/Tokyo"
        fb = env.step(Action.tool_call("get_current_time", {"timezone": "Mars/Olympus"}, "t2"))
        assert fb.error_code == ErrorCode.INVALID_ARGUMENTS and "Mars/Olympus" in fb.message  # the server's own words
        assert "check the arguments against the tool's schema" not in fb.hint
        env.close()
    finally:
        session.close()


def test_time_server_via_the_cli_logs_stderr_to_the_run_log(tmp_path):
    out = _cli("call", "--mcp", " ".join(TIME), "--tool", "get_current_time", "--args", '{"timezone": "Mars/Olympus"}',
               workdir=tmp_path)
    assert out.returncode == 1 and json.loads(out.stdout)["error_code"] == "INVALID_ARGUMENTS"
    assert "failed" not in out.stderr  # the server logs the failed call on its stderr: not the terminal's
    log = (tmp_path / "mcp.log").read_text()
    assert "mcp:mcp_server_time |" in log and "get_current_time" in log


def test_git_server_name_comes_from_the_executable_not_the_last_argument(repo, tmp_path):
    out = _cli("tools", "--mcp", " ".join([*GIT, "--repository", str(repo)]), "--json", workdir=tmp_path)
    assert out.returncode == 0, out.stderr
    sources = {r["source"] for r in json.loads(out.stdout)} - {"sandbox"}
    assert sources == {"mcp:mcp_server_git"}  # before: mcp:repo (the --repository value)
    out = _cli("tools", "--mcp", "name=work " + " ".join([*GIT, "--repository", str(repo)]), "--json", workdir=tmp_path)
    assert {r["source"] for r in json.loads(out.stdout)} - {"sandbox"} == {"mcp:work"}


def test_git_diff_of_a_6mb_file_is_capped_with_its_digest_in_the_trace(repo, tmp_path):
    big = "".join(f"line {i:07d} of a generated file that nobody should read whole\n" for i in range(100_000))
    assert len(big) > 6_000_000
    (repo / "big.txt").write_text(big)
    subprocess.run(["git", "add", "big.txt"], cwd=repo, check=True)
    whole = MCPServerTools(GIT, timeout_s=60, max_result_chars=0)
    try:
        full = whole.call("git_diff_staged", {"repo_path": str(repo)})
    finally:
        whole.close()
    text = result_text(full.result)
    assert full.ok and len(text) > 6_000_000  # what came back whole before the cap
    store = tmp_path / "traces.sqlite"
    session = HarnessSession(HarnessConfig.defaults(enabled=True, mcp=[" ".join(GIT)], mcp_timeout_s=60, max_result_chars=4000,
                                           store=str(store)))
    try:
        env = session.env_factory()
        env.reset(next(t for t in load_tasks("dev") if t.category == "tool_use"))
        fb = env.step(Action.tool_call("git_diff_staged", {"repo_path": str(repo)}, "g1"))
        env.close()
    finally:
        session.close()
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert fb.ok and fb.result.startswith(text[:4000]) and len(fb.result) < 4100
    assert f"{len(text):,} characters" in fb.result and fb.cost["result_chars"] == float(len(text))
    assert digest in fb.message
    with HarnessStore(str(store)) as traces:
        recorded = [s for s in traces.steps() if s["kind"] == "feedback"]
    assert len(recorded) == 1 and digest in json.dumps(recorded[0]["payload"])


def test_fetch_reads_a_loopback_page_and_maps_its_failures(page_url):
    server = MCPServerTools([*FETCH, "--allow-private-ips"], timeout_s=60)
    try:
        fb = server.call("fetch", {"url": page_url})
        assert fb.ok and "Hello from loopback" in fb.result and "Opening hours: 9-17." in fb.result
        dead = page_url.rsplit(":", 1)[0] + ":1/page"  # nothing listens on port 1
        fb = server.call("fetch", {"url": dead})
        assert fb.error_code == ErrorCode.INFRA and "connection" in fb.message  # the network, not the arguments
        fb = server.call("fetch", {"url": "not a url"})
        assert fb.error_code == ErrorCode.INVALID_ARGUMENTS and "valid URL" in fb.message
        assert server.restarts == 0  # tool errors are answers, not a dead server
    finally:
        server.close()
    strict = MCPServerTools(FETCH, timeout_s=60)  # the default refuses private addresses
    try:
        fb = strict.call("fetch", {"url": page_url})
        assert fb.error_code == ErrorCode.PERMISSION_DENIED and "--allow-private-ips" in fb.message
    finally:
        strict.close()
