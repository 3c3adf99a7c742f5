"""The scripted oracle: solves samples of every split, varies naturally, recovers from faults, and sees only
what a planner sees."""
import pytest

from mpa_jax.envs import generate_split, make_env, message_to_actions, run_oracle_episode
from mpa_jax.envs.benchmark import templates_for

SPECIAL = ["seed.coach_70kg", "convert.fallback_calc", "sms.cellular_off", "sms.ambiguous_name", "bank.transfer_over_limit",
           "route.between_saved", "device.bluetooth_low_power", "weather.offline", "shop.buy_now", "sub.transfer_via_roles",
           "note.create_retry", "event.update_recover", "product.update_recover", "reminder.create_ask", "contact.lookup_paged"]


class PlannerView:
    """Only what any planner gets: reset/step/verify. Touching anything else (world, task, ledger) fails."""

    def __init__(self, env):
        self._env = env

    def reset(self, task):
        return self._env.reset(task)

    def step(self, action):
        return self._env.step(action)

    def verify(self):
        return self._env.verify()


@pytest.fixture(scope="module")
def samples():
    out = {}
    for split in ("train", "dev", "test"):
        names = [t.name for t in templates_for(split)[::9]] + [n for n in SPECIAL if n in {t.name for t in templates_for(split)}]
        out[split] = generate_split(split, templates=names, per_template=1)
    return out


def test_oracle_solves_a_sample_of_every_split(samples):
    env = make_env("sandbox")
    view = PlannerView(env)
    for split, tasks in samples.items():
        assert len(tasks) >= 60, split
        for t in tasks:
            for seed in (0, 1):
                ep = run_oracle_episode(view, t, seed=seed)
                assert ep.verification.success, (t.id, seed, [c for c in ep.verification.checks if not c.passed])
    env.close()


def test_episode_messages_match_steps_and_tools(samples):
    env = make_env("sandbox")
    t = next(t for t in samples["test"] if t.template == "seed.coach_70kg")
    ep = run_oracle_episode(env, t, seed=0)
    assert ep.messages[0]["role"] == "system" and ep.messages[len(t.history) + 1] == {"role": "user", "content": t.instruction}
    assert ep.tools == [s.to_openai() for s in env.tool_specs(t)]
    acts = [a for m in ep.messages[len(t.history) + 2:] if m["role"] == "assistant" for a in message_to_actions(m)]
    assert [(a.kind, a.name, a.arguments, a.text) for a in acts] == [(s.action.kind, s.action.name, s.action.arguments, s.action.text) for s in ep.steps]
    assert all(m.get("reasoning_content") for m in ep.messages[len(t.history) + 2:] if m["role"] == "assistant")
    # the recovery path of the seed scenario: kg rejected, kilograms rejected, then the calculator
    calls = [(s.action.name, s.feedback.status if s.feedback else None) for s in ep.steps]
    assert calls[:3] == [("convert_units", "error"), ("convert_units", "error"), ("calculate", "ok")]
    assert ep.steps[-1].feedback is None and "154.32" in ep.steps[-1].action.text
    env.close()


def test_oracle_varies_order_and_batching_but_always_succeeds(samples):
    env = make_env("sandbox")
    t = next(t for t in samples["test"] if t.template == "route.between_saved")
    shapes = set()
    for seed in range(12):
        ep = run_oracle_episode(env, t, seed=seed)
        assert ep.verification.success
        shapes.add(tuple(tuple(c["function"]["arguments"].get("query", "") for c in m.get("tool_calls", []))
                         for m in ep.messages if m["role"] == "assistant"))
    assert len(shapes) >= 3  # both orders, sequential and parallel
    canon = {run_oracle_episode(env, t, variation=False).ledger_hash for _ in range(2)}
    assert len(canon) == 1
    env.close()


def test_oracle_recovers_from_faults_and_device_state(samples):
    env = make_env("sandbox")
    by_template = {t.template: t for t in samples["test"]}
    for name, fix in [("sms.cellular_off", "set_"), ("device.bluetooth_low_power", "set_low_power_mode"),
                      ("weather.offline", "set_airplane_mode")]:
        ep = run_oracle_episode(env, by_template[name], seed=0)
        names = [s.action.name for s in ep.steps]
        assert ep.verification.success and any(n.startswith(fix) for n in names[1:]), (name, names)
        assert any(s.feedback and s.feedback.error_code and s.feedback.error_code.value == "PRECONDITION_FAILED" for s in ep.steps)
    paged = next(t for t in samples["test"] if t.template.endswith(".lookup_paged"))
    ep = run_oracle_episode(env, paged, seed=0)
    offsets = [s.action.arguments.get("offset") for s in ep.steps if s.action.name.startswith("search_")]
    assert ep.verification.success and offsets == [None, 0]
    retry = next(t for t in samples["test"] if t.template.endswith(".create_retry"))
    ep = run_oracle_episode(env, retry, seed=0)
    codes = [s.feedback.error_code.value if s.feedback and s.feedback.error_code else "ok" for s in ep.steps]
    assert {"TRANSIENT", "RATE_LIMITED"} & set(codes) and ep.verification.success
    env.close()
