"""The contract's JSON round trip and the one rendering of actions/feedback into chat messages."""
import json

import pytest

from mpa_jax.envs import (
    Action,
    Check,
    ContractError,
    ErrorCode,
    Feedback,
    Step,
    Task,
    Trajectory,
    Verification,
    action_to_message,
    feedback_to_message,
    make_env,
    message_to_actions,
    tool_call_to_action,
)


def _task(**kw):
    base = dict(id="t1", domain="utilities", category="tool_use", difficulty=1, instruction="hi", tools=["calculate"],
                verifier={"goals": []}, gold=[{"kind": "message", "text": "ok"}])
    base.update(kw)
    return Task(**base)


def test_round_trip_of_every_record():
    fb = Feedback.error(ErrorCode.NOT_FOUND, "no such contact", call_id="c1", hint="search first")
    v = Verification(success=False, score=0.5, checks=[Check("goal", False, "missing")])
    traj = Trajectory(task_id="t1", tokens=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.5],
                      steps=[Step(Action.tool_call("calculate", {"expression": "1+1"}, call_id="c1"), fb),
                             Step(Action.message("done"), None)], verification=v)
    for obj in (_task(history=[{"role": "user", "content": "x"}]), fb, v, traj):
        again = type(obj).from_json(obj.to_json())
        assert again == obj
        assert again.to_json() == obj.to_json()
    assert json.loads(_task().to_json())["schema_version"] == 1


def test_bad_records_name_the_problem():
    with pytest.raises(ContractError, match="unknown field 'bogus'"):
        Task.from_dict({**_task().to_dict(), "bogus": 1})
    with pytest.raises(ContractError, match="unknown domain"):
        _task(domain="gardening")
    with pytest.raises(ContractError, match="error_code"):
        Feedback.from_dict({"call_id": "", "status": "error", "error_code": "OOPS"})


def test_render_round_trip_and_feedback_json():
    calls = [Action.tool_call("search_contacts", {"query": "Alex"}, call_id="call_1"),
             Action(kind="delegate", name="finder", text="find it", call_id="call_2")]
    m = action_to_message(calls, reasoning="look up first")
    assert m["role"] == "assistant" and m["reasoning_content"] == "look up first"
    assert m["tool_calls"][1]["function"] == {"name": "delegate", "arguments": {"agent": "finder", "instruction": "find it"}}
    back = message_to_actions(m)
    assert [(a.kind, a.name, a.call_id) for a in back] == [("tool_call", "search_contacts", "call_1"), ("delegate", "finder", "call_2")]
    assert action_to_message(Action.message("All set."))["content"] == "All set."
    with pytest.raises(ContractError):
        action_to_message([Action.message("x"), calls[0]])

    ok = feedback_to_message(Feedback(call_id="call_1", status="ok", result={"b": 1, "a": [2]}))
    assert ok == {"role": "tool", "tool_call_id": "call_1", "content": '{"result":{"a":[2],"b":1},"status":"ok"}'}
    err = json.loads(feedback_to_message(Feedback.error(ErrorCode.UNSUPPORTED_VALUE, "no kg", hint="use calculate"))["content"])
    assert err == {"status": "error", "error": "UNSUPPORTED_VALUE", "message": "no kg", "hint": "use calculate"}
    # malformed JSON arguments survive parsing as a string: the env answers INVALID_ARGUMENTS
    a = tool_call_to_action({"function": {"name": "calculate", "arguments": "{not json"}})
    assert a.arguments == "{not json"


def test_make_env_registry():
    env = make_env("sandbox")
    assert env.kind == "sandbox"
    env.close()
    with pytest.raises(ValueError, match="unknown env kind 'nope'"):
        make_env("nope")


def test_task_json_keeps_gold_argument_order_and_the_split_cache_reads_it_back(tmp_path, monkeypatch):
    """Gold arguments are in the tool schema's order when generated; the task's JSON keeps that order (the rest
    is canonical), so a task read back from the split cache demonstrates its calls as the fresh one does."""
    from mpa_jax.envs import canonical_json, generate_split, load_tasks

    t = _task(gold=[{"kind": "tool_call", "name": "create_event", "arguments": {"title": "x", "date": "2026-01-01"}}],
              verifier={"z": 1, "a": {"d": 2, "c": 3}})
    text = t.to_json()
    assert text.index('"title"') < text.index('"date"')  # gold arguments: kept
    assert text.index('"a"') < text.index('"z"') and text.index('"c"') < text.index('"d"')  # elsewhere: sorted
    assert list(Task.from_json(text).gold[0]["arguments"]) == ["title", "date"]
    assert canonical_json(Task.from_json(text).to_dict()) == canonical_json(t.to_dict())

    monkeypatch.setenv("MPA_JAX_CACHE", str(tmp_path))
    fresh = generate_split("dev", per_template=1)
    load_tasks("dev", per_template=1)  # writes the cache
    cached = load_tasks("dev", per_template=1)  # reads it back
    assert list(tmp_path.rglob("*.jsonl")), "the split cache was not written"
    order = lambda ts: [list(g["arguments"]) for x in ts for g in x.gold if g.get("kind") == "tool_call"]  # noqa: E731
    assert order(cached) == order(fresh)
    assert any(a != sorted(a) for a in order(fresh)), "no gold call whose schema order differs from sorted order"
