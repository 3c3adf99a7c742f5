"""The sandbox's follow-up category (envs/taskgen/followup.py): conversations in the real sandbox.

Real parts throughout: generated tasks through the quality gate, the SQLite sandbox, the oracle, and the
token-level runner driven by a scripted engine (the planner's words fixed, everything else real).
"""
from __future__ import annotations

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs import DOMAINS, Action, generate_split, make_env, run_oracle_episode
from mpa_jax.envs.gate import check_task
from mpa_jax.envs.oracle import run_plan
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.envs.taskgen import TEMPLATES
from mpa_jax.envs.taskgen.followup import CATEGORY, FOLLOWUPS_KEY
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine

PICKED = ["alarm.followup_amend", "contact.followup_share", "followup.convert_then_text"]


@pytest.fixture(scope="module")
def tasks():
    return generate_split("dev", templates=PICKED)


@pytest.fixture(scope="module")
def env():
    e = make_env("sandbox")
    yield e
    e.close()


def test_the_category_covers_every_domain_and_holds_templates_out():
    fu = [t for t in TEMPLATES if t.category == CATEGORY]
    assert {t.domain for t in fu} == set(DOMAINS)
    assert any(t.held_out for t in fu) and not all(t.held_out for t in fu)
    # registered after every single-request template: the order (and tasks) of those is unchanged
    first = next(i for i, t in enumerate(TEMPLATES) if t.category == CATEGORY)
    assert all(t.category == CATEGORY for t in TEMPLATES[first:first + len(fu)])


def test_follow_up_tasks_pass_the_gate_and_the_oracle_replays_them(tasks, env):
    assert sorted({t.template for t in tasks}) == sorted(PICKED)
    for t in tasks:
        (turn,) = t.metadata[FOLLOWUPS_KEY]
        obs = env.reset(t)
        assert all(turn not in str(m["content"]) for m in obs["messages"])  # hidden until the planner replies
        assert check_task(t, env) is None
        ep = run_oracle_episode(env, t, seed=3)
        assert ep.verification.success
        assert [m["content"] for m in ep.messages if m["role"] == "user"][-1] == turn
        # stopping after the first turn's reply (the follow-up never acted on) fails on the end state
        first_reply = next(i for i, s in enumerate(t.gold) if s["kind"] == "message")
        assert not run_plan(env, t, t.gold[:first_reply] + [{"kind": "message", "text": "Sure, done."}]).verification.success


def test_the_sandbox_answers_a_reply_with_the_next_turn_then_ends(tasks, env):
    t = next(t for t in tasks if t.template == "followup.convert_then_text")
    env.reset(t)
    fb = env.step(Action.message("It's about 6 miles."))
    assert fb.ok and fb.user_turn == t.metadata[FOLLOWUPS_KEY][0] and not fb.conversation_over and not env.done
    fb = env.step(Action.message("Okay."))
    assert fb.conversation_over and env.done and env.final_message == "Okay."
    assert env.step(Action.message("again")).error_code.value == "PRECONDITION_FAILED"
    assert not env.verify().success  # nothing was texted
    # a task without follow-ups still ends on the first message (every other category)
    plain = generate_split("dev", templates=["sms.contact"])[0]
    env.reset(plain)
    assert env.step(Action.message("hi")).conversation_over and env.done


def test_the_runner_shows_the_follow_up_and_the_end_state_decides(tasks):
    t = next(t for t in tasks if t.template == "alarm.followup_amend")
    create, update = (s for s in t.gold if s["kind"] == "tool_call")
    tok = tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
    replies = [tk.format_tool_call(create["name"], create["arguments"]), "Created.",
               tk.format_tool_call(update["name"], update["arguments"]), "Changed."]
    cfg = EpisodeConfig.defaults(max_turns=4, max_new_tokens=128, max_total_tokens=16384)
    engine = ScriptedEngine(tok, replies)
    (traj,) = run_episodes(engine, tok, [t], SandboxEnv, cfg)
    assert traj.verification.success and traj.user_turns() == t.metadata[FOLLOWUPS_KEY] and traj.costs["user_turns"] == 1
    prompts = [tok.decode(p) for batch, _, _ in engine.calls for p in batch]
    turn = t.metadata[FOLLOWUPS_KEY][0]
    assert sum(turn in p for p in prompts) == 2 and turn not in prompts[0] and turn not in prompts[1]
    # answering the follow-up without the update leaves the first value: the state check fails
    (traj,) = run_episodes(ScriptedEngine(tok, replies[:2] + ["Changed it."]), tok, [t], SandboxEnv, cfg)
    assert not traj.verification.success and traj.costs["user_turns"] == 1
    failed = {c.name for c in traj.verification.checks if not c.passed}
    assert failed == {"amended_alarm", "no_collateral"}  # the row keeps the first turn's value: not the one asked for
