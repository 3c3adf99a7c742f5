"""The loop's harness stage: failures of the round's training side (its data, its RL rollouts) are mined
into proposals, reviewed by `harness.review.policy` and released as a harness version (auto), or queued with
the reason recorded (manual); the held-out eval's failures are clustered for the report and never mined. Uses the harness evolution of issue 14 on real sandbox episodes: a planner
that says relation "coworker" (refused: the enum says colleague) and then fixes it."""
import json
import os

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs import load_tasks, make_env, write_jsonl
from mpa_jax.loop import Loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _episodes():
    from mpa_jax.envs.episode import run_chat_episode
    from mpa_jax.envs.oracle import run_oracle_episode
    from mpa_jax.harness.planners import PlannerReply, ScriptedPlanner

    out = []
    for task in [t for t in load_tasks("train") if t.template == "contact.create"][:2]:
        args = dict(task.gold[0]["arguments"])
        planner = ScriptedPlanner([PlannerReply(calls=[{"name": "create_contact", "arguments": dict(args, relation="coworker")}]),
                                   PlannerReply(calls=[{"name": "create_contact", "arguments": dict(args, relation="colleague")}]),
                                   PlannerReply(text="Done.")])
        out.append(run_chat_episode(planner, make_env("sandbox"), task, max_turns=8).trajectory())
    fault_tasks = [t for t in load_tasks("dev") if any(f.get("code") == "UNSUPPORTED_VALUE" for f in t.faults)]
    out += [run_oracle_episode(make_env("sandbox"), t).trajectory() for t in fault_tasks]
    return out


@pytest.mark.parametrize("review", ["auto", "manual"])
def test_harness_stage_releases_a_reviewed_version(tmp_path, review):
    cfg = load_config_file(os.path.join(ROOT, "configs", "micro.py"))
    cfg.harness.review.policy = review
    loop = Loop(cfg, str(tmp_path), progress=False)
    run_dir = tmp_path / "eval" / "r1" / "off"
    run_dir.mkdir(parents=True)
    write_jsonl(str(run_dir / "run0.jsonl"), _episodes())
    # the same failures in the held-out eval only: clustered for the report, no proposal
    res = loop.harness(1, {"eval_json": str(tmp_path / "eval" / "r1" / "eval.json")}, None)
    assert res["failures"] >= 2 and res["clusters"] and res["proposals"] == 0 and res["skipped"] == "release: no proposals mined"
    rollouts = tmp_path / "r1" / "rl" / "rollouts"
    rollouts.mkdir(parents=True)
    write_jsonl(str(rollouts / "step_000001.jsonl"), _episodes())
    res = loop.harness(1, {"eval_json": str(tmp_path / "eval" / "r1" / "eval.json")}, None, str(rollouts))
    mined = json.loads(open(res["mined"]).read())
    assert mined["failures"] >= 4 and res["proposals"] >= 1
    if review == "auto":
        assert not res.get("skipped") and res["version"] not in ("none", "")
        manifest = json.loads((tmp_path / "harness" / "versions" / res["version"] / "manifest.json").read_text())
        assert manifest["version"] == res["version"] and manifest["auto_approved"]
        assert res["version_dir"].endswith(res["version"]) and res["changes"]
        # the release gate ran for real (micro config: 4 train tasks, with vs without the new version)
        assert res["gate"]["tasks"] == 4 and res["gate"]["candidate"] >= res["gate"]["baseline"]
    else:
        assert res["version"] == "none" and "queued for review" in res["skipped"] and res["queued"] >= 1


def test_release_gate_withdraws_a_version_that_lowers_success(tmp_path, monkeypatch):
    """A released version whose gate figure (success with it, on train tasks) is below the current
    harness's is withdrawn: CURRENT returns to the parent, the directory is kept as `.withdrawn`, the
    changelog says why, and the next release reuses the number. The gate's two evaluations are replaced
    by fixed figures here (the real evaluation runs in test_harness_stage_releases_a_reviewed_version and
    the micro loop test); what is tested is the decision and the withdrawal, on real files."""
    from mpa_jax.harness import evolution

    cfg = load_config_file(os.path.join(ROOT, "configs", "micro.py"))
    cfg.harness.review.policy = "auto"
    loop = Loop(cfg, str(tmp_path), progress=False)
    monkeypatch.setattr(loop, "release_gate", lambda *a, **k: {"tasks": 4, "candidate": 0.25, "baseline": 0.5, "baseline_harness": "none"})
    rollouts = tmp_path / "r1" / "rl" / "rollouts"
    rollouts.mkdir(parents=True)
    write_jsonl(str(rollouts / "step_000001.jsonl"), _episodes())
    res = loop.harness(1, {"eval_json": str(tmp_path / "eval" / "r1" / "eval.json")}, None, str(rollouts))
    root = tmp_path / "harness"
    assert res["version"] == "none" and res["withdrawn"] and "withdrawn by the release gate" in res["skipped"]
    assert (root / "versions" / (res["withdrawn"] + ".withdrawn") / "manifest.json").is_file()
    assert not (root / "versions" / res["withdrawn"]).exists()
    assert evolution.current_version(str(root)) != res["withdrawn"]
    assert f"{res['withdrawn']} withdrawn" in (root / "CHANGELOG.md").read_text()
    # the stage again (a resumed run): nothing new to release, nothing left to gate
    again = loop.harness(1, {"eval_json": str(tmp_path / "eval" / "r1" / "eval.json")}, None, str(rollouts))
    assert again["version"] == "none" and not again.get("withdrawn")
