"""The episode runner under adversarial model outputs and engine faults (bench/fuzz_episodes.py, small):
every episode kept, every Trajectory valid JSON, nothing raised, harness off and on."""
import importlib.util
import os

from mpa_jax.tokenizer.toolcall import parse_tool_calls

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("fuzz_episodes", os.path.join(ROOT, "bench", "fuzz_episodes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unrepresentable_json_in_a_tool_call_is_a_parse_error_not_a_poisoned_trajectory():
    """Found by the fuzz: NaN / Infinity / 1e999 and an unpaired \\ud800 escape parse in Python but cannot be
    written (canonical JSON refuses non-finite numbers, UTF-8 refuses lone surrogates): a parse error now."""
    for args in ('{"x": NaN}', '{"x": -Infinity}', '{"x": 1e999}', '{"q": "\\ud800"}', '{"q": {"\\udc00": 1}}'):
        out = parse_tool_calls('<tool_call>{"name": "search_contacts", "arguments": %s}</tool_call>' % args)
        assert not out.calls and out.errors and out.errors[0].kind == "bad_json", args
    ok = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"x": 1e300, "q": "\\ud83d\\ude00"}}</tool_call>')
    assert ok.calls and ok.calls[0].arguments == {"x": 1e300, "q": "😀"}  # finite numbers and paired escapes are fine


def test_fuzzed_outputs_and_engine_faults_lose_no_episode_and_crash_nothing():
    res = _bench().run(outputs=600, faults=30, seed=7)
    assert res["outputs"] >= 600 and sum(res["faults"].values()) == 30
    eps = res["episodes"]
    assert eps["episodes_harness_off"] > 0 and eps["episodes_harness_on"] > 0  # run() asserted every task got its episode
    # engine faults end episodes as infra with their cause; malformed turns are feedback, never infra
    assert {"non-finite", "outside the tokenizer"} <= set(res["infra_by_cause"]) and "agent loop error" not in res["infra_by_cause"]
    assert res["malformed_turns"]["parse_error"] > 0 and res["malformed_turns"]["control_token"] > 0
