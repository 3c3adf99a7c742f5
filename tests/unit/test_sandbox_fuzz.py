"""Fuzzing: thousands of random actions (valid, nearly valid and junk); the env never raises, never hits an
internal error, and the ledger reproduces the state (action replay and diff replay)."""
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpa_jax.envs import Action, Feedback, Task, make_env
from mpa_jax.envs.tools import TOOLS
from mpa_jax.envs.world import World, apply_diff, diff_states

FUZZ_TOOLS = sorted([
    "search_contacts", "get_contact", "create_contact", "update_contact", "delete_contact", "send_sms", "make_call",
    "create_note", "update_note", "delete_note", "create_cart_item", "delete_cart_item", "place_order", "transfer_money",
    "pay_bill", "play_song", "pause_playback", "set_airplane_mode", "set_cellular", "set_bluetooth", "set_low_power_mode",
    "convert_units", "calculate", "get_weather", "book_ride", "cancel_ride", "create_playlist_song", "update_card",
    "create_event", "update_event", "delete_blocked_number", "create_blocked_number", "send_email", "get_route",
])
TASK = Task(id="fuzz", domain="utilities", category="tool_use", difficulty=1, instruction="fuzz", tools=FUZZ_TOOLS,
            verifier={"goals": []}, gold=[], persona_seed=5,
            faults=[{"tool": "*", "code": "TRANSIENT", "p": 0.1}, {"tool": "calculate", "code": "RATE_LIMITED", "on_calls": [2]},
                    {"tool": "search_contacts", "page_size": 1, "p": 0.5}])
ROLE_TASK = Task.from_dict({**TASK.to_dict(), "id": "fuzz-roles",
                            "roles": {"planner": FUZZ_TOOLS[:3], "a": FUZZ_TOOLS[::2], "b": FUZZ_TOOLS[1::2]}})
TEXT = st.text(alphabet=string.ascii_letters + string.digits + " -+*/().%", max_size=12)


def _value(schema):
    t = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if t == "string":
        pat = schema.get("pattern", "")
        if pat.startswith("^") and "_[0-9]+$" in pat:
            return st.integers(0, 30).map(lambda n, p=pat[1:pat.index("_[0-9]")]: f"{p}_{n}")
        if "\\d{4}" in pat:
            return st.sampled_from(["2026-03-01", "2026-04-15", "2026-13-40"])
        if "[01]" in pat:
            return st.sampled_from(["09:30", "23:59", "25:00"])
        return st.one_of(TEXT, st.sampled_from(["contact_3", "+1-555-123-4567", "kg", "lb", "a@b.com", "Lisbon", "2*(3+4)"]))
    if t == "integer":
        return st.integers(int(schema.get("minimum", -5)) - 1, int(schema.get("maximum", 100)) + 1)
    if t == "number":
        return st.floats(-10, 5000, allow_nan=False)
    if t == "boolean":
        return st.booleans()
    return st.none()


def _args(name):
    params = TOOLS[name].spec.parameters
    props, req = params["properties"], set(params.get("required", ()))
    return st.fixed_dictionaries({k: _value(v) for k, v in props.items() if k in req},
                                 optional={k: _value(v) for k, v in props.items() if k not in req})


junk = st.one_of(st.none(), st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5), st.floats()), max_size=3))
tool_action = st.sampled_from(FUZZ_TOOLS).flatmap(lambda n: _args(n).map(lambda a: Action.tool_call(n, a)))
bad_action = st.one_of(
    st.tuples(st.sampled_from(FUZZ_TOOLS + ["nope", "delegate", ""]), junk).map(lambda p: Action.tool_call(p[0], p[1])),
    st.sampled_from(FUZZ_TOOLS).map(lambda n: Action.tool_call(n, '{"id": ')),
    st.just(Action.delegate("ghost", "x")), st.just(Action(kind="bogus")), st.just("garbage"),
    st.sampled_from(["a", "b", "planner"]).map(lambda r: Action.tool_call("delegate", {"agent": r, "instruction": "go"})),
    st.sampled_from(["a", "b"]).map(lambda r: Action.delegate(r, "go")),
)
ending = st.sampled_from([Action.message("done"), Action.finish(), Action(kind="message", text="")])
body = st.lists(st.one_of(*[tool_action] * 6, bad_action), min_size=25, max_size=60)
# usually no ending, sometimes one at the end, sometimes one in the middle (later calls must be refused)
actions = st.tuples(body, st.integers(0, 5), ending).map(
    lambda p: p[0] if p[1] < 3 else p[0] + [p[2]] if p[1] < 5 else p[0][: len(p[0]) // 2] + [p[2]] + p[0][len(p[0]) // 2:])


def _run(env, acts, task):
    env.reset(task)
    fbs = [env.step(a) for a in acts]
    return fbs, env.ledger_hash, env.state()


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.sampled_from([TASK, ROLE_TASK]))
def test_random_actions_keep_the_env_consistent(acts, task):
    env = make_env("sandbox")
    try:
        fbs, h1, end = _run(env, acts, task)
        assert all(isinstance(fb, Feedback) for fb in fbs)
        assert not [fb for fb in fbs if fb.error_code is not None and fb.error_code.value == "INFRA"], [f.message for f in fbs]
        assert len(env.ledger) == len(acts)
        diffs = [d for e in env.ledger for d in e.get("diff", [])]
        assert all(e["diff"] == [] for e in env.ledger if e.get("status") == "error")
        # replaying the actions reproduces ledger and state
        _, h2, end2 = _run(env, acts, task)
        assert h1 == h2 and end == end2
        # the ledger's diffs alone reproduce the end state from the start state
        w = World()
        w.load(task.persona_seed, task.initial_state)
        start = w.dump()
        apply_diff(w, diffs)
        assert w.dump() == end
        assert {(d["table"], d["id"]) for d in diff_states(start, end)} <= {(d["table"], d["id"]) for d in diffs}
        w.close()
    finally:
        env.close()
