"""The one chat-level driver (`envs.episode.run_chat_episode`) on the real sandbox: the oracle is a planner under
the same episode rules, infra is only what the env reports as infra, and a bug raises with the episode named."""
from __future__ import annotations

import pytest

from mpa_jax.envs import ErrorCode, Feedback, load_tasks, make_env
from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.episode import PlannerReply, run_chat_episode
from mpa_jax.envs.oracle import OraclePlanner, run_oracle_episode, run_plan
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.harness.planners import ScriptedPlanner


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("dev") if t.category == "tool_use" and not t.faults and not t.roles
                and sum(s["kind"] == "tool_call" for s in t.gold) >= 2)


class _BrokenPlanner:
    name = "broken"

    def respond(self, messages, tools):
        return messages[0]["no such key"]


class _FaultEnv(SandboxEnv):
    """Reports a lost device on its first tool call (a world fault, `EnvFault`)."""

    def step(self, action):
        if action.kind == "tool_call":
            raise EnvFault("device unreachable")
        return super().step(action)


class _BuggyEnv(SandboxEnv):
    def step(self, action):
        if action.kind == "tool_call":
            return action.arguments["no such argument"]
        return super().step(action)


class _TimeoutEnv(SandboxEnv):
    def step(self, action):
        if action.kind == "tool_call":
            return Feedback.error(ErrorCode.TIMEOUT, "the service did not answer", action.call_id)
        return super().step(action)


def test_a_bug_in_a_planner_raises_with_the_task_named(task):
    with pytest.raises(KeyError, match="no such key") as info:
        run_chat_episode(_BrokenPlanner(), make_env("sandbox"), task, max_turns=4)
    assert any(task.id in n and "broken" in n for n in info.value.__notes__)


def test_env_faults_are_infra_and_env_bugs_raise(task):
    ep = run_oracle_episode(_FaultEnv(), task, seed=0)
    assert ep.finish_reason == "infra" and "device unreachable" in ep.infra and ep.verification.infra_error
    assert ep.trajectory().infra_failure
    with pytest.raises(KeyError, match="no such argument") as info:
        run_oracle_episode(_BuggyEnv(), task, seed=0)
    assert any(task.id in n for n in info.value.__notes__)


def test_the_oracle_runs_under_the_episode_rules(task):
    ok = run_oracle_episode(make_env("sandbox"), task, seed=0)
    assert ok.verification.success and ok.finish_reason == "answer" and ok.steps[-1].feedback is None
    # the turn limit holds for the oracle too
    cut = run_oracle_episode(make_env("sandbox"), task, seed=0, max_turns=1)
    assert cut.finish_reason == "max_turns" and not cut.verification.success and cut.costs["turns"] == 1
    # an INFRA/TIMEOUT answer ends it as infra (the oracle used to retry through it on its own loop)
    timed = run_oracle_episode(_TimeoutEnv(), task, seed=0)
    assert timed.finish_reason == "infra" and len(timed.steps) == 1
    # a plan that runs out without an answer (the gate's corrupted copies): the planner stops, no message is sent
    stopped = run_plan(make_env("sandbox"), task, task.gold[:-1])
    assert stopped.finish_reason == "planner_stop" and all(s.action.kind == "tool_call" for s in stopped.steps)
    assert stopped.verification is not None and not stopped.verification.infra_error


def test_the_oracle_reads_only_the_chat(task):
    """The oracle's replies depend on nothing but the plan and the messages it is shown: replaying its replies
    through a scripted planner gives the same episode (steps, chat and verdict)."""
    env = make_env("sandbox")
    oracle = run_oracle_episode(env, task, seed=3)
    replies, planner = [], OraclePlanner(task.gold, 3)

    def record(messages, tools, turn):
        reply = planner.respond(messages, tools)
        replies.append(reply)
        return reply

    first = run_chat_episode(ScriptedPlanner(record), env, task, max_turns=50)
    again = run_chat_episode(ScriptedPlanner(replies), env, task, max_turns=50)
    for ep in (first, again):
        assert [s.to_dict() for s in ep.steps] == [s.to_dict() for s in oracle.steps]
        assert ep.messages == oracle.messages and ep.verification == oracle.verification
    assert isinstance(replies[-1], PlannerReply) and replies[-1].text == task.gold[-1]["text"]
