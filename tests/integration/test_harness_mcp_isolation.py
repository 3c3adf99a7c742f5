"""What an MCP server can reach (issue 52 item 5), with a real server written with the official `mcp` SDK
(tests/data/mcp_probe_server.py) over stdio: its own process and process group, an environment of
`harness.mcp.BASE_ENV` plus the variables its entry names, answers capped at `harness.max_result_chars`, a
wire limit on what it may send, and `harness.mcp_timeout_s` on a call that never answers."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from mpa_jax.envs import ErrorCode
from mpa_jax.harness.config import MCPServerSpec, parse_mcp_entry
from mpa_jax.harness.mcp import BASE_ENV, MCPServerTools, wire_limit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = [sys.executable, os.path.join(REPO, "tests", "data", "mcp_probe_server.py")]
CAP = 1_000  # harness.max_result_chars of these servers: wire limit 32 MiB (the floor)
TIMEOUT = 10  # harness.mcp_timeout_s: the start (the SDK import on a loaded host) and each call


@pytest.fixture(scope="module")
def probe():
    os.environ["MPA_TEST_SECRET"] = "s3cret"  # ours, never named by the entry: the server must not see it
    os.environ["MPA_TEST_GRANTED"] = "granted"
    spec = parse_mcp_entry(f"env=MPA_TEST_GRANTED {' '.join(PROBE)}", max_result_chars=CAP)
    server = MCPServerTools(spec, timeout_s=TIMEOUT)
    yield server
    server.close()
    del os.environ["MPA_TEST_SECRET"], os.environ["MPA_TEST_GRANTED"]


def test_a_server_is_its_own_process_group(probe):
    ids = probe.call("ids", {}, "i").result
    ids = json.loads(ids) if isinstance(ids, str) else ids  # a bare dict comes back as its JSON text
    assert ids["pid"] == probe.pid != os.getpid() and ids["ppid"] == os.getpid()
    assert ids["pgid"] == ids["pid"] != os.getpgid(0)  # killed as a group, apart from ours


def test_a_server_sees_only_the_base_environment_and_what_its_entry_names(probe):
    assert probe.call("getenv", {"name": "MPA_TEST_SECRET"}, "e1").result == "<unset>"
    assert probe.call("getenv", {"name": "MPA_TEST_GRANTED"}, "e2").result == "granted"
    assert probe.call("getenv", {"name": "PATH"}, "e3").result == os.environ["PATH"]
    seen = set(probe.call("environ", {}, "e4").result)
    assert seen <= set(BASE_ENV) | {"MPA_TEST_GRANTED"} | {"LC_CTYPE"}, seen  # LC_CTYPE: Python's own locale coercion
    assert "XLA_FLAGS" not in seen or "XLA_FLAGS" not in os.environ


def test_an_oversized_answer_is_cut_to_the_configured_cap(probe):
    fb = probe.call("big", {"n": 50_000}, "b1")
    assert fb.ok and len(fb.result) < CAP + 100 and fb.result.startswith("x" * CAP)
    assert "cut to 1,000 of 50,000 characters" in fb.message and fb.cost["result_chars"] == 50_000


def test_a_message_past_the_wire_limit_stops_the_server_and_the_next_call_works(probe):
    first = probe.pid
    fb = probe.call("big", {"n": wire_limit(CAP) + 4096}, "b2")
    assert fb.error_code == ErrorCode.INFRA and f"past the limit of {wire_limit(CAP):,}" in fb.message, fb.message
    assert probe.pid != first and probe.call("big", {"n": 10}, "b3").result == "x" * 10


def test_a_call_that_never_answers_is_a_timeout_and_the_server_is_killed(probe):
    hung = probe.pid
    t0 = time.monotonic()
    fb = probe.call("hang", {}, "h1")
    assert fb.error_code == ErrorCode.TIMEOUT and f"within {TIMEOUT} s" in fb.message
    assert time.monotonic() - t0 < TIMEOUT + 10  # the timeout, plus the kill on a loaded host
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)  # reaped: killed, not left running
    assert probe.call("getenv", {"name": "MPA_TEST_GRANTED"}, "h2").result == "granted"  # a fresh server


def test_env_entries_name_variables_one_by_one():
    assert parse_mcp_entry({"command": PROBE, "env": ["B", "A"]}).env == ("A", "B")
    with pytest.raises(ValueError, match="one by one"):
        parse_mcp_entry(f"env=* {' '.join(PROBE)}")
    with pytest.raises(ValueError, match="not an environment variable name"):
        MCPServerSpec(command=PROBE, env=("A-B",))
