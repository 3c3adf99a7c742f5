"""The MCP side's pure functions: `harness.mcp` entries, server names, tool-error codes, the result cap."""
from __future__ import annotations

import hashlib
import json

import pytest

from mpa_jax.envs import ErrorCode, Feedback
from mpa_jax.harness.config import HarnessConfig, HarnessConfigError, parse_mcp_entry
from mpa_jax.harness.mcp import server_name, tool_error_code
from mpa_jax.harness.results import cap_result, cut_marker


def test_entry_strings_dicts_and_json_are_one_server_each():
    s = parse_mcp_entry("prefix=calc_ rename=calculate:calc_eval,other:o2 allow=a,b name=calc uvx mcp-server-calculator --x 1")
    assert s.command == ["uvx", "mcp-server-calculator", "--x", "1"]
    assert (s.name, s.prefix, s.rename, s.allow) == ("calc", "calc_", {"calculate": "calc_eval", "other": "o2"}, {"a", "b"})
    assert s.shown_name("calculate") == "calc_eval" and s.shown_name("add") == "calc_add"
    # an option-looking word after the executable is the server's own argument
    assert parse_mcp_entry("srv prefix=x").command == ["srv", "prefix=x"]
    d = parse_mcp_entry({"command": ["/opt/my;dir/srv", "a b"], "allow": ["*"]})
    assert d.command == ["/opt/my;dir/srv", "a b"] and d.allow is None
    j = parse_mcp_entry('{"command": "python3 -c \'import sys; sys.exit(4)\'", "prefix": "p_"}')
    assert j.command == ["python3", "-c", "import sys; sys.exit(4)"] and j.prefix == "p_"


@pytest.mark.parametrize("entry, message", [
    ("python 'open", "cannot split"),
    ({"command": []}, "needs a command"),
    ({"command": ["x"], "prefix": "bad prefix"}, "prefix 'bad prefix'"),
    ("rename=calculate x", "must be OLD:NEW"),
    ({"command": ["x"], "rename": {"a": "no spaces"}}, "the new name"),
    ('{"command": ["x"],', "not a JSON object"),
    (3, "a command string or a dict"),
])
def test_bad_entries_name_what_is_wrong(entry, message):
    with pytest.raises(HarnessConfigError, match=message):
        parse_mcp_entry(entry)


def test_config_keeps_the_list_and_never_splits_on_semicolons():
    c = HarnessConfig.defaults(mcp=["python a.py; rm -rf /", "node b.js"], mcp_log="/tmp/run/mcp.log", max_result_chars=100)
    servers = c.mcp_servers
    assert [s.command for s in servers] == [["python", "a.py;", "rm", "-rf", "/"], ["node", "b.js"]]
    assert all(s.log == "/tmp/run/mcp.log" and s.max_result_chars == 100 for s in servers)
    assert HarnessConfig.defaults(mcp="python srv.py --db 'a;b.db'").mcp_servers[0].command == ["python", "srv.py", "--db", "a;b.db"]
    assert HarnessConfig.defaults(mcp="").mcp_servers == []
    with pytest.raises(HarnessConfigError, match="max_result_chars"):
        HarnessConfig.defaults(max_result_chars=-1)
    with pytest.raises(HarnessConfigError, match="must be a list"):
        HarnessConfig.defaults(mcp=3)


@pytest.mark.parametrize("command, name", [
    (["python3", "-m", "mcp_server_time"], "mcp_server_time"),
    (["/venv/bin/python3.11", "-u", "-m", "mcp_server_git", "--repository", "/src/repo"], "mcp_server_git"),
    (["python", "tests/data/mcp_calc_server.py", "--db", "x.db"], "mcp_calc_server"),
    (["python3", "-c", "print(1)"], "python3"),
    (["/venv/bin/mcp-server-git", "--repository", "/src/repo"], "mcp-server-git"),
    (["uvx", "mcp-server-fetch@2026.10.24", "--allow-private-ips"], "mcp-server-fetch"),
    (["npx", "-y", "@modelcontextprotocol/server-memory"], "server-memory"),
    (["uv", "run", "--with", "x", "srv.py"], "srv"),
    (["node", "build/index.js"], "index"),
    (["docker", "run", "-i", "img"], "docker"),
])
def test_server_name_is_the_executable_or_what_it_runs(command, name):
    assert server_name(command) == name


@pytest.mark.parametrize("message, code", [
    ("1 validation error for fetchArguments\nurl\n  Input should be a valid URL [type=url_parsing]", ErrorCode.INVALID_ARGUMENTS),
    ("Error executing tool git_status: 1 validation error for statusArguments\nrepo_path\n  Field required", ErrorCode.INVALID_ARGUMENTS),
    ("Error executing tool get_current_time: Invalid timezone: 'No time zone found with key Mars/Olympus'", ErrorCode.INVALID_ARGUMENTS),
    ("Error executing tool fetch: Failed to fetch robots.txt http://127.0.0.1:1/robots.txt due to a connection issue", ErrorCode.INFRA),
    ("httpx.ConnectError: [Errno 111] Connection refused", ErrorCode.INFRA),
    ("Temporary failure in name resolution", ErrorCode.INFRA),
    ("the request timed out after 30 s", ErrorCode.TIMEOUT),
    ("Refused to fetch http://127.0.0.1/x: 127.0.0.1 is not a public address", ErrorCode.PERMISSION_DENIED),
    ("Failed to fetch https://x.y/z - status code 404", ErrorCode.NOT_FOUND),
    ("Too Many Requests: rate limit exceeded", ErrorCode.RATE_LIMITED),
    ("Error executing tool git_status: /tmp/nonexistent_repo", ErrorCode.PRECONDITION_FAILED),
])
def test_tool_error_text_gets_the_code_it_names(message, code):
    assert tool_error_code(message) == code


def test_cap_keeps_the_head_a_marker_the_size_and_the_digest():
    text = "x" * 6_500_000
    fb = cap_result(Feedback(call_id="c", status="ok", result=text), 1000)
    assert fb.result == "x" * 1000 + cut_marker(1000, 6_500_000) and "6,500,000" in fb.result
    assert hashlib.sha256(text.encode()).hexdigest() in fb.message and fb.cost["result_chars"] == 6_500_000.0
    structured = {"rows": [{"i": i, "s": "é" * 10} for i in range(500)]}
    full = json.dumps(structured, ensure_ascii=False, sort_keys=True)
    cut = cap_result(Feedback(call_id="c", status="ok", result=structured), 200)
    assert cut.result.startswith(full[:200]) and hashlib.sha256(full.encode()).hexdigest() in cut.message
    small = Feedback(call_id="c", status="ok", result={"a": 1})
    assert cap_result(small, 200) is small and cap_result(Feedback(call_id="c", status="ok", result=text), 0).result == text
    err = cap_result(Feedback.error(ErrorCode.INFRA, "boom " * 1000, "c"), 100)
    assert len(err.message) < 200 and "message cut: 100 of 5,000" in err.message
