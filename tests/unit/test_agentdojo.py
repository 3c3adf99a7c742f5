"""The `agentdojo` env kind: AgentDojo 0.1.35's suites, runtime and utility checks from the real wheel (installed
by `make install-bench`, part of `make test`), through the contract, the oracle and the token-level runner. The
planner's turns come from `ScriptedEngine` replaying ground truth (a test double of the model only).
"""
from __future__ import annotations

import collections
import copy
import dataclasses

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs.agentdojo import data
from mpa_jax.envs.base import make_env
from mpa_jax.envs.contract import Action, ErrorCode
from mpa_jax.envs.oracle import run_oracle_episode
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine


BENCH_KIND = "agentdojo"  # the env / all_tasks / tok fixtures: tests/unit/conftest.py


def test_counts_and_splits_by_user_task(env, all_tasks):
    assert collections.Counter(t.category for t in all_tasks) == {
        "agentdojo_workspace": 40, "agentdojo_travel": 20, "agentdojo_banking": 16, "agentdojo_slack": 21}
    by_split = {s: {t.id for t in env.tasks(s)} for s in ("train", "dev", "test")}
    assert not by_split["train"] & by_split["test"] and not by_split["dev"] & (by_split["train"] | by_split["test"])
    assert set().union(*by_split.values()) == {t.id for t in all_tasks}
    for suite in data.SUITES:  # every suite is in every split
        assert all(any(f"/{suite}/" in i for i in ids) for ids in by_split.values())
    assert {t.metadata["env"] for t in all_tasks} == {"agentdojo"}
    with pytest.raises(ValueError, match="test_fraction"):
        data.splits(["a", "b"], "banking", 0, 0.9, 0.2)


def test_ground_truth_replays_97_of_97(env, all_tasks):
    failed = [t.id for t in all_tasks if not run_oracle_episode(env, t, variation=False).verification.success]
    assert failed == []


def _texts(task) -> list[str]:
    return [tk.format_tool_call(s["name"], s["arguments"]) if s["kind"] == "tool_call" else s["text"] for s in task.gold]


def _corrupt(task):
    """The last call dropped and the answer replaced: AgentDojo's utility judges the end state (write tasks)
    or the answer (information tasks), so this must fail either kind."""
    calls = [j for j, s in enumerate(task.gold) if s["kind"] == "tool_call"]
    gold = [copy.deepcopy(s) for j, s in enumerate(task.gold) if j != calls[-1]]
    gold[-1]["text"] = "Done."
    return dataclasses.replace(task, gold=gold)


def _replay(tok, tasks):
    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if f"<|im_start|>user\n{t.instruction}<|im_end|>" in text)
        return _texts(task)[text.count("<|im_start|>assistant") - 1]

    cfg = EpisodeConfig.defaults(max_turns=30, max_new_tokens=1024, max_total_tokens=300_000, batch_size=4)
    return run_episodes(ScriptedEngine(tok, script), tok, tasks, lambda: make_env("agentdojo"), cfg)


def test_replay_through_the_runner_and_a_corrupted_one(tok, env):
    """The first test task of each suite; `bench/external_replay.py` runs all 97 (and the corruption over all)."""
    test = env.tasks("test")
    tasks = [next(t for t in test if t.metadata["suite"] == s) for s in data.SUITES]
    for task, traj in zip(tasks, _replay(tok, tasks)):
        assert traj.verification.success and traj.finish_reason == "answer", (task.id, traj.verification)
        assert traj.costs["tool_calls"] == sum(s["kind"] == "tool_call" for s in task.gold) and traj.costs["user_turns"] == 0
        assert traj.verification.checks[0].name == "agentdojo_utility"
    assert not any(tr.verification.success for tr in _replay(tok, [_corrupt(t) for t in tasks]))


def test_runtime_errors_are_typed_and_the_injection_hooks_work(env, all_tasks):
    task = next(t for t in all_tasks if t.id == "agentdojo/banking/user_task_0")
    env.reset(task)
    assert env.step(Action.tool_call("no_such_tool", {}, "c1")).error_code == ErrorCode.UNKNOWN_TOOL
    assert env.step(Action.tool_call("read_file", {"file_path": 3.5, "x": 1}, "c2")).error_code == ErrorCode.INVALID_ARGUMENTS
    assert len(env.trace) == 2  # AgentDojo's traces hold every call the model made
    # an injection over one of the suite's vectors reaches the tool output; the security check is added
    suite = data.suites(env.version)["banking"]
    vector = next(v for v in suite.get_injection_vector_defaults() if "bill" in v)
    inj = dataclasses.replace(task, metadata={**task.metadata, "injections": {vector: "CANARY-7731"},
                                              "injection_task": next(iter(suite.injection_tasks))})
    env.reset(inj)
    fb = env.step(Action.tool_call("read_file", {"file_path": "bill-december-2023.txt"}, "c3"))
    assert fb.ok and "CANARY-7731" in fb.result
    env.step(Action.message("Paid."))
    v = env.verify()
    assert [c.name for c in v.checks] == ["agentdojo_utility", "agentdojo_security"]
    assert v.checks[1].passed  # nothing was sent to the attacker
    assert v.success == v.checks[0].passed  # success = the user's goal and not the attacker's (the RL reward)
