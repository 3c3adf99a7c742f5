"""Evolution with review: failure traces -> clustered proposals with evidence -> approve/reject by id
-> a new harness version on disk (semver, CHANGELOG, manifest with hashes) that the runtime loads.
Nothing changes without a recorded approval; `review.policy=auto` is marked in the manifest."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpa_jax.envs import Action, ErrorCode, load_tasks, make_env, write_jsonl
from mpa_jax.harness import HarnessConfig, HarnessSession
from mpa_jax.envs.episode import run_chat_episode
from mpa_jax.envs.oracle import run_oracle_episode
from mpa_jax.harness.evolution import EvolutionError, read_version
from mpa_jax.harness.planners import PlannerReply, ScriptedPlanner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _contact_tasks():
    tasks = [t for t in load_tasks("train") if t.template == "contact.create"][:2]
    assert len(tasks) == 2
    return tasks


def _coworker_episode(task):
    """A planner that says relation "coworker" (refused: the enum says colleague), then fixes it."""
    args = dict(task.gold[0]["arguments"])
    bad = dict(args, relation="coworker")
    good = dict(args, relation="colleague")
    planner = ScriptedPlanner([PlannerReply(calls=[{"name": "create_contact", "arguments": bad}]),
                               PlannerReply(calls=[{"name": "create_contact", "arguments": good}]),
                               PlannerReply(text="Done.")])
    return run_chat_episode(planner, make_env("sandbox"), task, max_turns=8).trajectory()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    fault_tasks = [t for t in load_tasks("dev") if any(f.get("code") == "UNSUPPORTED_VALUE" for f in t.faults)]
    trajs = [run_oracle_episode(make_env("sandbox"), t).trajectory() for t in fault_tasks]
    trajs += [_coworker_episode(t) for t in _contact_tasks()]
    path = tmp_path_factory.mktemp("traces") / "traces.jsonl"
    write_jsonl(str(path), trajs)
    return str(path)


def _mpa(tmp_path, *args):
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", *args, "--workdir", str(tmp_path / "wd")],
                         capture_output=True, text=True, cwd=REPO)
    return out


def test_mine_review_release_and_load(tmp_path, traces):
    root = str(tmp_path / "harness")
    out = _mpa(tmp_path, "mine", "--traces", traces, "--root", root, "--json", "--config.harness.review.policy=manual")
    assert out.returncode == 0, out.stderr
    mined = json.loads(out.stdout)
    assert mined["version"] is None and len(mined["new"]) == mined["proposals"] >= 4
    assert not os.path.exists(os.path.join(root, "versions"))  # nothing changes without approval
    again = json.loads(_mpa(tmp_path, "mine", "--traces", traces, "--root", root, "--json",
                            "--config.harness.review.policy=manual").stdout)
    assert again["new"] == []  # mining the same traces twice proposes nothing new

    listing = json.loads(_mpa(tmp_path, "review", "--root", root, "--json").stdout)["proposals"]
    by_kind = {}
    for p in listing:
        by_kind.setdefault(p["kind"], []).append(p)
        assert p["status"] == "pending" and p["evidence"]
    (norm,) = [p for p in by_kind["normaliser"] if p["payload"]["arg"] == "relation"]
    assert norm["payload"] == {"tool": "create_contact", "arg": "relation", "from": "coworker", "to": "colleague"}
    skill = next(p for p in by_kind["skill"] if p["cluster"].startswith("convert_units|UNSUPPORTED_VALUE"))
    assert "calculate" in skill["payload"]["text"]
    desc = by_kind["tool_description"][0]
    examples = next(p for p in by_kind["training_examples"] if p["cluster"] == skill["cluster"])

    out = _mpa(tmp_path, "review", "--root", root, "--approve", norm["id"], "--approve", skill["id"], "--approve", examples["id"],
               "--reject", desc["id"], "--by", "alice", "--note", "checked the evidence")
    assert out.returncode == 0, out.stderr
    assert "harness version 0.2.0" in out.stdout  # a new skill: minor bump from 0.1.0
    vdir = os.path.join(root, "versions", "0.2.0")
    manifest = json.load(open(os.path.join(vdir, "manifest.json")))
    assert manifest["parent"] == "0.1.0" and manifest["auto_approved"] is False
    assert {p["id"] for p in manifest["proposals"]} == {norm["id"], skill["id"], examples["id"]}
    assert all(p["approved_by"] == "alice" for p in manifest["proposals"])
    assert set(manifest["files"]) >= {"rewrites.json", "descriptions.json", "training_examples.jsonl",
                                      f"skills/{skill['payload']['name']}.json"}
    assert json.load(open(os.path.join(vdir, "descriptions.json"))) == {}  # the rejected edit is not in
    assert len(open(os.path.join(vdir, "training_examples.jsonl")).read().splitlines()) == len(examples["payload"]["task_ids"])
    assert open(os.path.join(root, "CURRENT")).read().strip() == "0.2.0"
    assert "## 0.2.0" in open(os.path.join(root, "CHANGELOG.md")).read()
    # Approving a decided proposal again is a one-line user error.
    out = _mpa(tmp_path, "review", "--root", root, "--approve", norm["id"])
    assert out.returncode == 2 and "already approved" in out.stderr

    # The runtime under the new version: the approved rewrite turns the refused value into the accepted one.
    session = HarnessSession(HarnessConfig.defaults(enabled=True, version_dir=vdir))
    assert session.version_label == "0.2.0" and skill["payload"]["name"] in session.skills.skills
    task = _contact_tasks()[0]
    env = session.env_factory()
    env.reset(task)
    fb = env.step(Action.tool_call("create_contact", dict(task.gold[0]["arguments"], relation="coworker"), "c1"))
    assert fb.ok, fb
    raw = make_env("sandbox")
    raw.reset(task)
    assert raw.step(Action.tool_call("create_contact", dict(task.gold[0]["arguments"], relation="coworker"), "c1")).error_code \
        == ErrorCode.INVALID_ARGUMENTS

    # A file changed after release no longer matches the manifest.
    with open(os.path.join(vdir, "rewrites.json"), "a") as f:
        f.write(" ")
    with pytest.raises(EvolutionError, match="rewrites.json does not match"):
        read_version(vdir)


def test_auto_policy_releases_and_the_manifest_says_so(tmp_path, traces):
    root = str(tmp_path / "auto")
    out = _mpa(tmp_path, "mine", "--traces", traces, "--root", root, "--json", "--config.harness.review.policy=auto")
    assert out.returncode == 0, out.stderr
    version = json.loads(out.stdout)["version"]
    manifest = json.load(open(os.path.join(root, "versions", version, "manifest.json")))
    assert manifest["auto_approved"] is True and all(p["approved_by"] == "auto-policy" for p in manifest["proposals"])
    assert "auto-approved" in open(os.path.join(root, "CHANGELOG.md")).read()


def test_bad_trace_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    out = _mpa(tmp_path, "mine", "--traces", str(bad), "--root", str(tmp_path / "r"))
    assert out.returncode == 2 and "bad.jsonl:1" in out.stderr and out.stderr.count("\n") == 1


def test_evolve_is_the_one_release_service(tmp_path, traces):
    """`evolution.evolve` (what `mpa loop`'s harness stage and `mpa harness mine` both call): under the manual
    policy it queues and releases nothing; once a proposal is approved, the next evolve releases it, and
    proposals already queued are not queued twice."""
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.harness import evolution
    from mpa_jax.harness.store import HarnessStore

    root = str(tmp_path / "svc")
    trajs = read_jsonl(traces, Trajectory)
    first = evolution.evolve(root, trajs, "manual")
    assert first.version is None and first.added and set(first.added) == {p["id"] for p in first.proposals}
    with HarnessStore(evolution.store_path(root)) as store:
        store.decide(first.added[0], "approved", "tester", "ok")
    second = evolution.evolve(root, trajs, "manual")
    assert second.added == [] and second.version == evolution.current_version(root)
    manifest = json.load(open(os.path.join(root, "versions", second.version, "manifest.json")))
    assert [p["id"] for p in manifest["proposals"]] == [first.added[0]]
