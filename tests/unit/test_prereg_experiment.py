"""The pre-registered RL experiment and co-evolution vs model-only (issue 53 items 2-3): the frozen config is the
registered one, records are skipped and tabled, the verdicts follow the targets, only a finished arm's evaluation
reads the pre-registered list, and both drivers run for real at micro size (real RL, real loop, real evaluation)."""
import ast
import copy
import json
import os
import pathlib

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.experiments import coevolution, prereg

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def frozen():
    return load_config_file(str(ROOT / "configs" / "prereg_rl.py"))


def test_the_frozen_config_is_the_registered_one(frozen):
    """Budget, arms and evaluation as registered in docs/preregistered.md, whose record names the config's hash:
    editing configs/prereg_rl.py (or what it inherits) after registration fails here."""
    assert (int(frozen.rl.steps), int(frozen.rl.tasks_per_step), int(frozen.rl.group_size)) == (40, 8, 8)
    assert int(frozen.prereg.eval_tasks) == 0 and float(frozen.rl.beta) == 0 and float(frozen.rl.failure_cost) == 0
    arms = {a["name"]: a for a in frozen.prereg.arms}
    assert {s for n, a in arms.items() for s in [a["seed"]] if a["algo"] == "care" and a["start"] == "starter"
            and a["beta"] == 0 and a["failure_cost"] == 0} == {0, 1, 2}
    assert {a["seed"] for a in arms.values() if a["algo"] == "vanilla" and a["start"] == "starter"} == {0, 1, 2}
    assert arms["care+beta-s0"]["beta"] > 0 and arms["care+failure-s0"]["failure_cost"] > 0
    assert {"start", "refresh", "care-refresh-s0", "vanilla-refresh-s0"} <= set(arms)
    doc = (ROOT / "docs" / "preregistered.md").read_text(encoding="utf-8")
    assert f"`{prereg.config_hash(frozen)}`" in doc, "configs/prereg_rl.py changed after its registration"


def test_an_arm_changes_only_algo_seed_beta_and_failure_cost(frozen):
    arm = next(a for a in frozen.prereg.arms if a["name"] == "care+beta-s0")
    cfg = prereg.arm_config(frozen, dict(arm))
    a, b = frozen.to_dict(), cfg.to_dict()
    changed = {f"rl.{k}" for k in a["rl"] if a["rl"][k] != b["rl"][k]} | {k for k in a if k != "rl" and a[k] != b[k]}
    assert changed <= {"rl.algo", "seed", "rl.beta", "rl.failure_cost"} and float(cfg.rl.beta) == 0.5
    with pytest.raises(ValueError, match="not an RL algorithm"):
        prereg.arm_config(frozen, {"name": "start", "algo": "none", "seed": 0, "beta": 0.0, "failure_cost": 0.0})


def test_only_a_finished_arm_is_evaluated_on_the_list():
    """`evaluate_on_test_set` (the experiment's one reader of the list) is called by `run_arm` after RL and nowhere
    else in the tree."""
    callers = set()
    for top in ("mpa_jax", "bench", "configs"):
        for p in (ROOT / top).rglob("*.py"):
            for fn in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(fn, ast.FunctionDef):
                    for n in ast.walk(fn):
                        if isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) == "evaluate_on_test_set":
                            callers.add((p.relative_to(ROOT).as_posix(), fn.name))
    assert callers == {("mpa_jax/experiments/prereg.py", "run_arm")}


def _record(arm, outcomes, config):
    tasks = {f"t{i}": {"success": s, "output_tokens": tok, "tool_calls": 1, "group": "seen" if i % 2 == 0 else "held_out"}
             for i, (s, tok) in enumerate(outcomes)}
    return {"arm": arm, "config": "prereg_rl", "config_hash": prereg.config_hash(config), "commit": "x", "finished": "now",
            "eval": {"tasks": len(tasks)}, "rl": {"steps": 40} if arm["algo"] != "none" else None, "refresh": None,
            "summary": prereg.summarise(tasks), "tasks": tasks}


def test_records_are_tabled_paired_and_judged(frozen, tmp_path):
    arms = {a["name"]: dict(a) for a in frozen.prereg.arms}
    start = [(False, 100)] * 10  # solves nothing
    care = [(True, 60), (True, 60), (True, 60), (True, 60), (False, 80)] + [(False, 80)] * 5  # t0-t3
    van = [(True, 100), (True, 100), (True, 100), (False, 150), (True, 100)] + [(False, 150)] * 5  # t0-t2, t4
    for name, outcomes in (("start", start), ("care-s0", care), ("vanilla-s0", van)):
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump(_record(arms[name], outcomes, frozen), f)
    out = prereg.write_table(frozen, str(tmp_path))
    text = out["table"]
    assert os.path.exists(out["png"]) and (tmp_path / "table.md").read_text().strip() == text.strip()
    # care 4/10, vanilla 4/10: equal success; tokens 72 vs 130 per episode = -44.6%; paired 1 / 1 (t3 vs t4)
    assert "success +0.0 points (paired tasks CARE-only / vanilla-only 1 / 1)" in text
    assert "output tokens -44.6%" in text and "met (provisional: 1 of 3 seeds)" in text
    # held-out tasks are t1, t3, t5..: care solves t1, t3 -> 40% vs start 0% -> +40 points, met
    assert "care vs its start (starter, 1 seed): held-out templates +40.0 points (paired held-out tasks gained / lost 2 / 0)" in text
    assert "not yet recorded: care-s1" in text and "WARNING" not in text
    # a record of another config is flagged
    other = copy.deepcopy(frozen)
    other.rl.lr = 1.0
    with open(tmp_path / "care-s1.json", "w") as f:
        json.dump(_record(arms["care-s1"], care, other), f)
    assert "WARNING: records of another config than the frozen one: care-s1" in prereg.write_table(frozen, str(tmp_path))["table"]


def test_recorded_arms_are_skipped(frozen, tmp_path):
    for a in frozen.prereg.arms:
        with open(tmp_path / f"{a['name']}.json", "w") as f:
            json.dump(_record(dict(a), [(True, 10), (False, 20)], frozen), f)
    logs = []
    assert prereg.run_arms(frozen, str(tmp_path / "work"), results=str(tmp_path), log=logs.append) == []
    assert len(logs) == len(frozen.prereg.arms) and all("recorded, skipped" in x for x in logs)
    with pytest.raises(ValueError, match="unknown arm"):
        prereg.run_arms(frozen, str(tmp_path / "work"), results=str(tmp_path), only=["nope"])


def test_a_config_without_the_experiment_section_is_refused():
    c = load_config_file(str(ROOT / "configs" / "micro.py"))
    with pytest.raises(ValueError, match="no prereg section: use configs/prereg_rl.py"):
        prereg.write_table(c)
    with pytest.raises(ValueError, match="no coevolution section: use configs/prereg_coevo.py"):
        coevolution.run_arms(c, "unused")


# ------------------------------------------------------------------ real runs at micro size

@pytest.fixture(scope="module")
def coevo(tmp_path_factory):
    """Both co-evolution arms of the micro loop (from scratch, 1 round: its harness stage is where they differ), for
    real; 2 evaluation tasks to keep it cheap."""
    from rich.console import Console

    tmp = tmp_path_factory.mktemp("coevo")
    c = load_config_file(str(ROOT / "configs" / "micro.py"))
    c.coevolution = type(c)({"starter": "", "results": str(tmp / "results")})
    c.loop.release_gate_tasks = 0  # the gate has its own loop tests; a release here is what the arms differ by
    c.loop.rounds, c.eval.max_tasks = 1, 2
    ran = coevolution.run_arms(c, str(tmp / "work"), progress=False, console=Console(quiet=True))
    return c, tmp, ran


def test_coevolution_runs_both_arms_and_tables_each_round(coevo):
    c, tmp, ran = coevo
    assert ran == ["model-only", "coevolution"]
    recs = {a: json.loads((tmp / "results" / f"{a}.json").read_text()) for a in coevolution.ARMS}
    mo = recs["model-only"]
    assert all(h.get("skipped", "").startswith("model-only arm") for h in mo["harness"]) and len(mo["harness"]) == 1
    assert all(s["harness_version"] == "none" for s in mo["stages"])
    assert not any("model-only arm" in h.get("skipped", "") for h in recs["coevolution"]["harness"])
    rows = coevolution.rows(recs)
    assert [r["stage"] for r in rows] == ["untrained", "SFT", "round 1"]
    for r in rows:  # the difference is the two arms' success on the same tasks, paired counts consistent with it
        n = recs["coevolution"]["eval_tasks"]
        assert r["difference"] == pytest.approx(r["coevolution"] - r["model_only"])
        assert r["gained"] - r["lost"] == round(r["difference"] * n)
    assert all(isinstance(r["same_weights"], bool) for r in rows)
    assert [s["weights"] != "" for s in recs["coevolution"]["stages"]] == [False, True, True]  # untrained: no export
    text = (tmp / "results" / "table.md").read_text()
    assert "| round 1 |" in text and "mean difference over rounds" in text
    # a second call finds both records and runs nothing
    assert coevolution.run_arms(c, str(tmp / "work"), progress=False) == []


def test_prereg_arm_runs_rl_evaluates_records_and_is_skipped_after(coevo):
    """One real arm at micro size: 1 RL step from the micro loop's final export, its evaluation on 4 tasks of the
    pre-registered list, the record and metrics; the same call again skips it."""
    c0, tmp, _ = coevo
    c = copy.deepcopy(c0)
    c.rl.steps, c.rl.checkpoint_every = 1, 1
    c.rl.c_lo, c.rl.c_hi = 0.3, 0.8
    c.prereg = type(c)({"results": str(tmp / "prereg"), "starter": str(tmp / "work" / "coevolution" / "final"), "eval_tasks": 4,
                        "refresh_steps": 1, "refresh_lr": 1e-4, "refresh_worlds": 0, "refresh_per_template": 1,
                        "arms": [{"name": "care-s0", "start": "starter", "algo": "care", "seed": 0, "beta": 0.0, "failure_cost": 0.0},
                                 {"name": "start", "start": "starter", "algo": "none", "seed": 0, "beta": 0.0, "failure_cost": 0.0}]})
    assert prereg.run_arms(c, str(tmp / "pwork"), progress=False, log=lambda *_: None) == ["care-s0", "start"]
    rec = json.loads((tmp / "prereg" / "care-s0.json").read_text())
    assert rec["rl"]["steps"] == 1 and rec["eval"]["tasks"] == 4 and len(rec["tasks"]) == 4
    assert all(k.startswith("test/") for k in rec["tasks"]) and rec["config_hash"] == prereg.config_hash(c)
    assert len((tmp / "prereg" / "care-s0.metrics.jsonl").read_text().splitlines()) == 1
    table = (tmp / "prereg" / "table.md").read_text()
    assert "| care-s0 | starter | care | 0 | 1 |" in table and "| start | starter | none | - | 0 |" in table
    assert prereg.run_arms(c, str(tmp / "pwork"), progress=False, log=lambda *_: None) == []


def test_an_option_added_after_registration_changes_the_hash_only_when_turned_on():
    """A key of `prereg.NEUTRAL_ADDITIONS` at its neutral value is no change to the frozen experiment; any other
    value of it is."""
    from mpa_jax.config import load_config_file
    from mpa_jax.experiments import prereg

    cfg = load_config_file(os.path.join(ROOT, "configs", "prereg_rl.py"))
    base = prereg.config_hash(cfg)
    cfg.envs.agentdojo.attack = "important_instructions"
    assert prereg.config_hash(cfg) != base
    cfg.envs.agentdojo.attack = ""
    cfg.envs.agentdojo.injection_tasks = 3
    assert prereg.config_hash(cfg) != base
    cfg.envs.agentdojo.injection_tasks = 0
    assert prereg.config_hash(cfg) == base
    cfg.rollout.compute_dtype = "float32"  # the engine's own compute dtype: not the registered experiment's
    assert prereg.config_hash(cfg) != base
