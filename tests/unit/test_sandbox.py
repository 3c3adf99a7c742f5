"""The sandbox: tool catalog, the per-call pipeline, typed errors, transactions, ledger and verification."""
import pytest

from mpa_jax.envs import DOMAINS, Action, ErrorCode, Task, make_env
from mpa_jax.envs.tools import TOOLS, Tool, ToolError
from mpa_jax.envs.world import World, apply_diff, diff_states, persona_world


def _task(tools, verifier=None, **kw):
    return Task(id="t", domain="communication", category="tool_use", difficulty=1, instruction="do it", tools=list(tools),
                verifier=verifier or {"goals": []}, gold=[], persona_seed=3, **kw)


@pytest.fixture
def env():
    e = make_env("sandbox")
    yield e
    e.close()


def test_catalog_is_large_strict_and_covers_domains():
    assert len(TOOLS) >= 200
    assert len({t.spec.app for t in TOOLS.values()}) >= 15
    assert {t.spec.domain for t in TOOLS.values()} == set(DOMAINS)
    for t in TOOLS.values():
        p = t.spec.parameters
        assert p["type"] == "object" and p["additionalProperties"] is False, t.name
        assert t.spec.kind in ("read", "write")
        assert t.spec.to_openai()["function"]["name"] == t.name
    assert sum(1 for t in TOOLS.values() if t.entity is not None) > 150  # most tools generated from tables


def test_bad_actions_get_typed_errors_never_exceptions(env):
    env.reset(_task(["get_contact", "send_sms", "search_contacts"]))
    cases = [
        (Action.tool_call("fly_to_moon", {}), ErrorCode.UNKNOWN_TOOL),
        (Action.tool_call("calculate", {"expression": "1+1"}), ErrorCode.UNKNOWN_TOOL),  # exists but not allowed
        (Action.tool_call("get_contact", {"id": 3}), ErrorCode.INVALID_ARGUMENTS),
        (Action.tool_call("get_contact", {"id": "contact_1", "extra": True}), ErrorCode.INVALID_ARGUMENTS),
        (Action.tool_call("get_contact", {}), ErrorCode.INVALID_ARGUMENTS),
        (Action.tool_call("get_contact", {"id": "note_1"}), ErrorCode.INVALID_ARGUMENTS),
        (Action.tool_call("get_contact", '{"id": "contact_1"'), ErrorCode.INVALID_ARGUMENTS),  # malformed JSON
        (Action.tool_call("get_contact", ["contact_1"]), ErrorCode.INVALID_ARGUMENTS),
        (Action.tool_call("get_contact", {"id": "contact_999"}), ErrorCode.NOT_FOUND),
        (Action.tool_call("search_contacts", {"query": "a", "limit": True}), ErrorCode.INVALID_ARGUMENTS),
        (Action(kind="teleport"), ErrorCode.INVALID_ARGUMENTS),
        ("not an action", ErrorCode.INVALID_ARGUMENTS),
        (Action.delegate("finder", "x"), ErrorCode.UNKNOWN_TOOL),  # no sub-agents in this task
    ]
    for action, code in cases:
        fb = env.step(action)
        assert fb.status == "error" and fb.error_code == code, (action, fb)
        assert fb.message
    ok = env.step(Action.tool_call("get_contact", '{"id": "contact_1"}'))  # JSON text that parses is fine
    assert ok.ok and ok.result["id"] == "contact_1"
    assert env.step(Action.message("bye")).ok
    after = env.step(Action.tool_call("get_contact", {"id": "contact_1"}))
    assert after.error_code == ErrorCode.PRECONDITION_FAILED and "over" in after.message
    assert env.step(Action.finish()).error_code == ErrorCode.PRECONDITION_FAILED


def test_preconditions_on_device_state_and_fix_hint(env):
    env.reset(_task(["send_sms", "set_airplane_mode", "set_cellular"], initial_state={"device": {"airplane_mode": True}}))
    fb = env.step(Action.tool_call("send_sms", {"to": "contact_3", "body": "hi"}))
    assert fb.error_code == ErrorCode.PRECONDITION_FAILED and "airplane" in fb.message
    assert fb.result == {"fix": {"name": "set_airplane_mode", "arguments": {"enabled": False}}}
    assert env.step(Action.tool_call("set_cellular", {"enabled": True})).error_code == ErrorCode.PRECONDITION_FAILED
    assert env.step(Action.tool_call("set_airplane_mode", {"enabled": False})).ok
    sent = env.step(Action.tool_call("send_sms", {"to": "contact_3", "body": "hi"}))
    assert sent.ok and sent.result["status"] == "sent"


def test_failed_write_rolls_back_and_records_no_diff(env, monkeypatch):
    note = TOOLS["create_note"].entity

    def half_write(world, args):
        world.insert(note, {"title": "half"})
        raise ToolError(ErrorCode.TRANSIENT, "crashed midway")

    monkeypatch.setitem(TOOLS, "create_note", Tool(TOOLS["create_note"].spec, half_write, TOOLS["create_note"].validate, ()))
    env.reset(_task(["create_note"]))
    before = env.state()
    fb = env.step(Action.tool_call("create_note", {"title": "x"}))
    assert fb.error_code == ErrorCode.TRANSIENT
    assert env.state() == before
    assert env.ledger[-1]["diff"] == []


def test_a_handler_bug_raises_naming_the_task_and_leaves_the_world_as_committed(env, monkeypatch):
    """A bug in a tool handler is not infra (only an env-reported fault is): it raises with a note naming the task
    and the tool, after the half-done write is rolled back."""
    note = TOOLS["create_note"].entity

    def boom(world, args):
        world.insert(note, {"title": "half"})
        raise RuntimeError("bug")

    monkeypatch.setitem(TOOLS, "create_note", Tool(TOOLS["create_note"].spec, boom, TOOLS["create_note"].validate, ()))
    env.reset(_task(["create_note"]))
    before = env.state()
    with pytest.raises(RuntimeError, match="bug") as info:
        env.step(Action.tool_call("create_note", {"title": "x"}))
    assert any("'create_note'" in n and "task 't'" in n for n in getattr(info.value, "__notes__", [])), info.value
    assert env.state() == before


def test_faults_fire_as_declared(env):
    faults = [{"tool": "convert_units", "code": "UNSUPPORTED_VALUE", "when": {"from_unit": ["kg"]}, "hint": "use calculate"},
              {"tool": "calculate", "code": "TRANSIENT", "on_calls": [1]}]
    env.reset(_task(["convert_units", "calculate"], faults=faults))
    assert env.step(Action.tool_call("convert_units", {"value": 1, "from_unit": "kg", "to_unit": "lb"})).error_code == ErrorCode.UNSUPPORTED_VALUE
    assert env.step(Action.tool_call("convert_units", {"value": 1, "from_unit": "g", "to_unit": "oz"})).ok
    assert env.step(Action.tool_call("calculate", {"expression": "2*3"})).error_code == ErrorCode.TRANSIENT
    assert env.step(Action.tool_call("calculate", {"expression": "2*3"})).result == {"result": 6.0}
    assert env.ledger[0]["fault"] == 0 and env.ledger[2]["fault"] == 1


def test_partial_page_fault_and_paging(env):
    env.reset(_task(["search_contacts"], faults=[{"tool": "search_contacts", "page_size": 1, "on_calls": [1]}]))
    first = env.step(Action.tool_call("search_contacts", {"query": "a"}))
    assert first.ok and first.result["count"] == 1 and first.result["has_more"] and first.result["next_offset"] == 1
    assert env.ledger[-1]["fault"] == 0
    rest = env.step(Action.tool_call("search_contacts", {"query": "a", "offset": 1, "limit": 50}))
    assert rest.ok and "has_more" not in rest.result
    assert first.result["results"][0]["id"] not in {r["id"] for r in rest.result["results"]}


def test_ledger_diffs_replay_to_the_end_state_and_hashes_are_deterministic(env):
    task = _task(["create_note", "update_note", "delete_note", "send_sms", "set_wifi", "transfer_money"])
    actions = [Action.tool_call("create_note", {"title": "Plan", "body": "x"}),
               Action.tool_call("update_note", {"id": "note_2", "pinned": True, "body": "changed"}),
               Action.tool_call("delete_note", {"id": "note_3"}),
               Action.tool_call("send_sms", {"to": "+1-555-000-1111", "body": "hey"}),
               Action.tool_call("set_wifi", {"enabled": False}),
               Action.tool_call("transfer_money", {"from_account_id": "account_1", "payee_id": "payee_1", "amount": 10})]
    hashes, ends = [], []
    for _ in range(2):
        env.reset(task)
        for a in actions:
            env.step(a)
        hashes.append(env.ledger_hash)
        ends.append(env.state())
    assert hashes[0] == hashes[1] and ends[0] == ends[1]
    w = World()
    w.load(task.persona_seed, {})
    start = w.dump()
    apply_diff(w, [d for e in env.ledger for d in e.get("diff", [])])
    assert w.dump() == ends[0]
    recorded = sorted((d["table"], d["id"]) for e in env.ledger for d in e.get("diff", []))
    assert sorted({(d["table"], d["id"]) for d in diff_states(start, ends[0])}) == sorted(set(recorded))


def test_verification_goals_collateral_minefield_milestones(env):
    c3 = persona_world(3)[2]["contact"][2]
    verifier = {"goals": [{"kind": "new_row", "entity": "sms", "name": "sent", "match": {"to_number": c3["phone"], "body": {"contains": "154.32"}}}],
                "answer": {"kind": "answer", "contains": [154.32]},
                "minefields": [{"kind": "call", "tool": "delete_contact", "name": "deleted_contact"}],
                "milestones": [{"tool": "calculate"}, {"tool": "send_sms"}]}
    task = _task(["send_sms", "calculate", "delete_contact", "create_note"], verifier)
    env.reset(task)
    v = env.verify()
    assert not v.success and v.score == 0.0  # doing nothing
    env.step(Action.tool_call("calculate", {"expression": "70*2.20462"}))
    env.step(Action.tool_call("send_sms", {"to": "contact_3", "body": "70 kg is 154.32 lb"}))
    env.step(Action.message("It is 154.32 lb."))
    v = env.verify()
    assert v.success and v.score == 1.0
    # collateral damage: an extra note fails "no_collateral" with partial credit
    env.reset(task)
    env.step(Action.tool_call("send_sms", {"to": "contact_3", "body": "154.32 lb"}))
    env.step(Action.tool_call("create_note", {"title": "oops"}))
    env.step(Action.message("154.32"))
    v = env.verify()
    assert not v.success and 0 < v.score < 1
    assert [c.name for c in v.checks if not c.passed] == ["no_collateral", "milestones"]
    # a minefield zeroes the score even when the goal is met
    env.reset(task)
    env.step(Action.tool_call("send_sms", {"to": "contact_3", "body": "154.32 lb"}))
    env.step(Action.tool_call("delete_contact", {"id": "contact_9"}))
    env.step(Action.message("154.32"))
    v = env.verify()
    assert not v.success and v.score == 0.0


def test_subagent_roles_gate_tools_and_attribute_calls(env):
    task = _task(["search_notes", "update_note"], {"goals": [{"kind": "field", "entity": "note", "id": "note_1", "values": {"pinned": True}}]},
                 roles={"planner": [], "finder": ["search_notes"], "editor": ["update_note"]})
    obs = env.reset(task)
    assert "delegate" in [t["function"]["name"] for t in obs["tools"]]
    assert env.step(Action.tool_call("search_notes", {"query": "a"})).error_code == ErrorCode.PERMISSION_DENIED
    assert env.step(Action.tool_call("delegate", {"agent": "ghost", "instruction": "x"})).error_code == ErrorCode.NOT_FOUND
    assert env.step(Action.tool_call("delegate", {"agent": "finder", "instruction": "find"})).ok
    assert env.step(Action.tool_call("search_notes", {"query": "a"})).ok
    assert env.step(Action.tool_call("update_note", {"id": "note_1", "pinned": True})).error_code == ErrorCode.PERMISSION_DENIED
    assert env.step(Action.delegate("editor", "pin it")).ok
    assert env.step(Action.tool_call("update_note", {"id": "note_1", "pinned": True})).ok
    assert [e["agent"] for e in env.ledger if e.get("status") == "ok" and e["type"] == "tool_call"] == ["finder", "editor"]


def test_observation_is_planner_visible_only(env):
    task = _task(["send_sms"], {"goals": [], "answer": {"kind": "answer", "contains": ["SECRET-ANSWER"]}},
                 history=[{"role": "user", "content": "Dana is my coach."}, {"role": "assistant", "content": "Noted."}])
    task.gold = [{"kind": "message", "text": "SECRET-GOLD"}]
    obs = env.reset(task)
    roles = [m["role"] for m in obs["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert "Current date and time" in obs["messages"][0]["content"]
    text = str(obs)
    assert "SECRET" not in text
    assert [t["function"]["name"] for t in obs["tools"]] == ["send_sms"]
