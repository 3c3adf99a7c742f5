"""The `bfcl` env kind: BFCL v4 multi-turn data, backends and `multi_turn_checker` from the real bfcl-eval wheel
(installed by `make install-bench`, part of `make test`), through the contract, the oracle and the token-level
runner. The planner's turns come from `ScriptedEngine` replaying ground truth (a test double of the model only).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import os
import sys

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs.base import kind_tasks, make_env
from mpa_jax.envs.bfcl import data
from mpa_jax.envs.contract import Action, ErrorCode
from mpa_jax.envs.oracle import run_oracle_episode, run_plan
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine

UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"


BENCH_KIND = "bfcl"  # the env / all_tasks / tok fixtures: tests/unit/conftest.py


def _cached_instances() -> list[str]:
    return [k for k in vars(sys.modules[UTILS]) if k.startswith("mpa_")] if UTILS in sys.modules else []


def test_splits_are_by_scenario_and_disjoint(env, all_tasks):
    by_split = {s: env.tasks(s) for s in ("train", "dev", "test")}
    scen = {s: {t.metadata["scenario"] for t in ts} for s, ts in by_split.items()}
    assert not scen["train"] & scen["test"] and not scen["train"] & scen["dev"] and not scen["dev"] & scen["test"]
    assert len(scen["test"]) == env.test_scenarios and len(scen["dev"]) == env.dev_scenarios
    assert scen["train"] | scen["dev"] | scen["test"] == set(range(data.N_SCENARIOS))
    # the four categories of a scenario travel together
    assert all(len(ts) == 4 * len(scen[s]) for s, ts in by_split.items())
    assert collections.Counter(t.category for t in all_tasks) == {f"bfcl_{c}": 200 for c in data.CATEGORIES}
    assert {t.id for t in all_tasks} == {t.id for ts in by_split.values() for t in ts}
    # the split is a function of the seed
    other = data.scenario_splits(1, env.test_scenarios, env.dev_scenarios)
    assert {i for i, s in other.items() if s == "test"} != scen["test"]
    with pytest.raises(ValueError, match="test_scenarios"):
        data.scenario_splits(0, 150, 60)


def test_tasks_and_tools_come_from_bfcl_docs(env, all_tasks):
    task = next(t for t in all_tasks if t.id == "bfcl/multi_turn_miss_func_0")
    e = data.entry("multi_turn_miss_func_0")
    assert task.instruction == e["question"][0][0]["content"] and task.metadata["env"] == "bfcl"
    specs = {s.name: s for s in env.tool_specs(task)}
    assert "sort" not in specs and "cd" in specs  # miss_func holds `sort` back until turn 3
    assert specs["cd"].parameters["additionalProperties"] is False and specs["cd"].app == "GorillaFileSystem"
    assert all(s.domain in data.CLASS_DOMAINS.values() for s in specs.values())
    assert task.domain == data.CLASS_DOMAINS["GorillaFileSystem"]


def test_oracle_replays_all_800_and_dropping_a_call_fails_all(env, all_tasks):
    ok = [run_oracle_episode(env, t, variation=False).verification.success for t in all_tasks]
    assert sum(ok) == 800
    dropped = []
    for t in all_tasks:
        calls = [j for j, s in enumerate(t.gold) if s["kind"] == "tool_call"]
        plan = [s for j, s in enumerate(t.gold) if j != calls[len(calls) // 2]]
        v = run_plan(env, t, plan).verification
        dropped.append(v.success)
        assert v.success or v.checks[0].detail.startswith("multi_turn:"), v.checks  # BFCL's error type is kept
    assert sum(dropped) == 0
    assert len(_cached_instances()) == 2  # only the live episode's backends (its two classes); no check's
    env.close()
    assert _cached_instances() == []  # every episode's and every check's backend instances were deleted


def _change_one_argument(plan: list[dict]) -> list[dict]:
    p = copy.deepcopy(plan)
    calls = [s for s in p if s["kind"] == "tool_call" and s["arguments"]]
    s = calls[len(calls) // 2]
    k = sorted(s["arguments"])[0]
    v = s["arguments"][k]
    s["arguments"][k] = (v + "_x" if isinstance(v, str) else (not v) if isinstance(v, bool)
                         else v + 7 if isinstance(v, (int, float)) else ["x"] if isinstance(v, list) else {})
    return p


def test_changing_one_argument_fails_bfcls_checker(env, all_tasks):
    # BFCL checks end states and that the ground truth's responses appear; an argument that changes neither
    # passes it (docs/benchmark.md lists the measured cases), so this asserts the rate, not every task
    passed = [t.id for t in all_tasks if run_plan(env, t, _change_one_argument(t.gold)).verification.success]
    assert len(passed) <= 0.02 * len(all_tasks), passed  # measured: 11 of 800 (3 scenarios x their categories)


def _gold_texts(task) -> list[str]:
    return [tk.format_tool_call(s["name"], s["arguments"]) if s["kind"] == "tool_call" else s["text"] for s in task.gold]


def _replay(tok, tasks, texts_of=_gold_texts):
    """Each task's gold, one step per assistant turn, through the token-level runner (the task is found by
    its first request in the prompt; the tasks given must differ there)."""
    assert len({t.instruction for t in tasks}) == len(tasks)

    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if f"<|im_start|>user\n{t.instruction}<|im_end|>" in text)
        return texts_of(task)[text.count("<|im_start|>assistant") - 1]

    cfg = EpisodeConfig.defaults(max_turns=20, max_new_tokens=512, max_total_tokens=200_000, batch_size=4)
    return run_episodes(ScriptedEngine(tok, script), tok, tasks, lambda: make_env("bfcl"), cfg)


def test_ground_truth_replay_through_the_runner_and_a_corrupted_one(tok, env):
    """A stratified subset (2 test scenarios x 4 categories); `bench/external_replay.py` runs all 800."""
    test = env.tasks("test")
    scenarios = sorted({t.metadata["scenario"] for t in test})[:2]
    for cat in data.CATEGORIES:
        tasks = [t for t in test if t.metadata["scenario"] in scenarios and t.metadata["bfcl_category"] == cat]
        for task, traj in zip(tasks, _replay(tok, tasks)):
            assert traj.verification.success and traj.finish_reason == "answer", (task.id, traj.verification)
            n_turns = task.metadata["user_turns"]
            assert traj.costs["user_turns"] == n_turns - 1 and len(traj.user_turns()) == n_turns - 1
            sampled = tok.decode([t for t, m in zip(traj.tokens, traj.loss_mask) if m])
            for turn in data.entry(task.metadata["bfcl_id"])["question"][1:]:
                if turn:
                    assert turn[0]["content"] in tok.decode(traj.tokens) and turn[0]["content"] not in sampled
            if cat == "miss_func":  # the held-back tool's doc reached the planner in a user turn
                held = next(iter(data.entry(task.metadata["bfcl_id"])["missed_function"].values()))
                shown = [m["content"] for m in traj.messages if m["role"] == "user" and data.ADDED_TOOLS_PROMPT in m["content"]]
                assert len(shown) == 1 and all(f'"name": "{n}"' in shown[0] for n in held)
    # corrupted through the runner: one argument changed, and one call dropped
    tasks = [t for t in test if t.metadata["scenario"] in scenarios and t.metadata["bfcl_category"] == "base"]
    changed = _replay(tok, tasks, lambda t: _gold_texts(dataclasses.replace(t, gold=_change_one_argument(t.gold))))
    assert not any(tr.verification.success for tr in changed)
    dropped = _replay(tok, tasks, lambda t: [x for j, x in enumerate(_gold_texts(t)) if j != 0])
    assert not any(tr.verification.success for tr in dropped)


def test_calls_are_validated_before_bfcl_evals_them(env, all_tasks):
    task = next(t for t in all_tasks if t.id == "bfcl/multi_turn_base_0")
    env.reset(task)
    bad = [Action.tool_call("__import__", {"name": "os"}, "c1"),
           Action.tool_call("cd", {"folder": "document", "x=__import__('os')": 1}, "c2"),
           Action.tool_call("cd", {}, "c3"),
           Action.tool_call("cd", {"folder": float("nan")}, "c4")]
    codes = [env.step(a).error_code for a in bad]
    assert codes == [ErrorCode.UNKNOWN_TOOL] + [ErrorCode.INVALID_ARGUMENTS] * 3 and env.calls == [[] for _ in env.calls]
    fb = env.step(Action.tool_call("cd", {"folder": "document"}, "c5"))
    assert fb.ok and env.calls[0] == [["cd(folder='document')"]]
    fb = env.step(Action.tool_call("cd", {"folder": "no_such_dir"}, "c6"))
    assert fb.error_code == ErrorCode.PRECONDITION_FAILED and "no_such_dir" in fb.message  # BFCL's own refusal
    v = env.verify()  # the conversation is not over: BFCL's force-terminated failure
    assert not v.success and v.checks[0].detail.startswith("multi_turn:force_terminated")
    env.close()
    assert _cached_instances() == []
    assert os.environ["BFCL_PROJECT_ROOT"] and "site-packages" not in os.environ["BFCL_PROJECT_ROOT"]


def test_kind_tasks_and_the_env_route_by_task(all_tasks):
    import ml_collections

    from configs.tiny import get_config

    cfg = get_config()
    assert isinstance(cfg.envs.bfcl, ml_collections.ConfigDict)
    tasks = kind_tasks("bfcl", cfg, "test")
    assert {t.metadata["env"] for t in tasks} == {"bfcl"} and {t.split for t in tasks} == {"test"}
    json.loads(tasks[0].to_json())  # a task JSONL (`mpa eval --split FILE`) keeps them


def test_rl_mixture_draws_bfcl_train_tasks():
    from configs.tiny import get_config
    from mpa_jax.rl.tasks import TaskSource

    cfg = get_config()
    cfg.envs.mixture = {"sandbox": 0.0, "simulated": 0.0, "adb": 0.0, "bfcl": 1.0}
    cfg.rl.selection = "cursor"
    draws = TaskSource(cfg.rl, cfg.envs, cfg.tasks, int(cfg.seed)).draw(step=0, n=6)
    assert [k for k, _ in draws] == ["bfcl"] * 6
    assert {t.split for _, t in draws} == {"train"} and all(t.metadata["env"] == "bfcl" for _, t in draws)
