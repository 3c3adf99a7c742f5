"""`mpa experiment rl-lift`: an interrupted experiment resumes after its last evaluated point (no segment
trained or evaluated twice), and its table, verdicts, curve, plot and report.

RL, export and evaluation are replaced by recording fakes here: what is under test is the experiment's own
bookkeeping. Their own resume runs on real parts elsewhere (RL's exact resume from orbax checkpoints in
tests/integration/test_rl_trainer.py; evaluation runs read back from their files in `Evaluator.run`).
"""
from __future__ import annotations

import json
import os
import shutil
import types

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.experiments import rl_lift as lift
from mpa_jax.experiments.arms import arm_config
from mpa_jax.start import repo_root

STARTER = os.path.join(repo_root(), "starter")


def _report(success: float, tokens: float) -> dict:
    return {"harness": {"off": {"overall": {"success": success, "mean_output_tokens": tokens, "mean_tool_calls": 2.0,
                                            "mean_output_tokens_success": tokens - 10, "mean_output_tokens_failure": tokens + 10},
                                "by_templates": {"seen": {"success": success + 0.05}, "held_out": {"success": success - 0.1}}}}}


@pytest.fixture
def fakes(monkeypatch):
    import mpa_jax.eval as ev
    import mpa_jax.export as ex
    import mpa_jax.rl.trainer as tr

    calls = {"rl": [], "eval": [], "interrupt_at": None}

    def run_rl(cfg, run_dir, *, max_steps, progress):
        calls["rl"].append((os.path.basename(run_dir), max_steps))
        calls["init"] = str(cfg.model.init_from)  # the start the arm's config was fitted to
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "metrics.jsonl"), "w", encoding="utf-8") as f:
            for s in range(1, max_steps + 1):
                f.write(json.dumps({"step": s, "rl/rollouts": 64.0}) + "\n")
        return types.SimpleNamespace(checkpoint_dir=os.path.join(run_dir, "checkpoints"), metrics_path=os.path.join(run_dir, "metrics.jsonl"))

    class Evaluator:
        def __init__(self, config, tasks, progress=True):
            self.tasks = tasks

        def evaluate(self, source, *, out_dir, label, workdir):
            if label == calls["interrupt_at"]:
                raise KeyboardInterrupt(label)
            calls["eval"].append(label)
            if label == "refresh":
                return _report(0.6, 100.0)
            step = 0 if label == "start" else int(label.rsplit("@", 1)[1])
            care = label.startswith("care")
            return _report(0.5 + 0.01 * step, (100.0 - (2.0 if care else 0.5) * step))

    monkeypatch.setattr(tr, "run_rl", run_rl)
    monkeypatch.setattr(ex, "export_checkpoint", lambda ckpt, out, dtype, tokenizer_dir: out)
    monkeypatch.setattr(ev, "Evaluator", Evaluator)
    monkeypatch.setattr(ev, "select_tasks", lambda *a, **k: ["t"] * 6)
    return calls


def _config(steps: int):
    c = load_config_file("configs/rl_lift.py")
    c.rl.steps = steps
    return c


def test_an_interrupted_experiment_resumes_after_its_last_evaluated_point(tmp_path, fakes):
    w = str(tmp_path / "lift")
    fakes["interrupt_at"] = "care-s0@4"
    with pytest.raises(KeyboardInterrupt):
        lift.rl_lift(_config(6), w, init="starter", seeds=1, algos=("care", "vanilla"), eval_every=2, progress=False)
    assert fakes["rl"] == [("care-s0", 2), ("care-s0", 4)] and fakes["eval"] == ["start", "care-s0@2"]
    fakes["rl"].clear(), fakes["eval"].clear()
    fakes["interrupt_at"] = None
    s = lift.rl_lift(_config(6), w, init="starter", seeds=1, algos=("care", "vanilla"), eval_every=2, progress=False)
    # step 2 is never trained or evaluated again; RL goes on from where its checkpoints are (run_rl resumes)
    assert fakes["rl"] == [("care-s0", 4), ("care-s0", 6), ("vanilla-s0", 2), ("vanilla-s0", 4), ("vanilla-s0", 6)]
    assert fakes["eval"] == ["start", "care-s0@4", "care-s0@6", "vanilla-s0@2", "vanilla-s0@4", "vanilla-s0@6"]
    # every arm ran with the config fitted to the start (as `--checkpoint starter` fits it), saved with a card beside it
    saved = json.load(open(os.path.join(w, "vanilla-s0", "config.json")))
    assert fakes["init"] == saved["model"]["init_from"] == saved["tokenizer"]["path"] == STARTER
    assert saved["rl"]["algo"] == "vanilla" and saved["context"] == json.load(open(os.path.join(STARTER, "mpa_checkpoint.json")))["context"]
    card = json.load(open(os.path.join(w, "vanilla-s0", "mpa_checkpoint.json")))
    assert card["stage"] == "rl" and card["tokenizer"] == "tokenizer" and card["recipe"]["start"] == STARTER
    curve = [json.loads(x) for x in open(os.path.join(w, "care-s0", "curve.jsonl"))]
    assert [p["step"] for p in curve] == [2, 4, 6] and [p["episodes"] for p in curve] == [128.0, 256.0, 384.0]
    assert [p["step"] for p in s["arms"]["care"]["0"]] == [2, 4, 6]
    # a third run finds everything done: it only summarises
    fakes["rl"].clear(), fakes["eval"].clear()
    lift.rl_lift(_config(6), w, init="starter", seeds=1, algos=("care", "vanilla"), eval_every=2, progress=False)
    assert fakes["rl"] == [] and fakes["eval"] == ["start"]
    for name in ("summary.json", "table.md", "rl_lift.png", "report.html"):
        assert os.path.getsize(os.path.join(w, name)) > 0, name
    # summarised at a smaller budget: only the points up to it, nothing run
    s = lift.rl_lift(_config(4), w, init="starter", seeds=1, algos=("care", "vanilla"), eval_every=2, progress=False)
    assert [p["step"] for p in s["arms"]["vanilla"]["0"]] == [2, 4] and fakes["rl"] == []
    # or with --until under the whole schedule (the learning-rate schedule stays rl.steps)
    s = lift.rl_lift(_config(6), w, init="starter", seeds=1, algos=("care", "vanilla"), eval_every=2, until=4, progress=False)
    assert [p["step"] for p in s["arms"]["care"]["0"]] == [2, 4] and (s["steps"], s["schedule"]) == (4, 6) and fakes["rl"] == []
    with pytest.raises(ValueError, match="--until must be in 1..config.rl.steps"):
        lift.rl_lift(_config(6), w, init="starter", seeds=1, algos=("care",), eval_every=2, until=8, progress=False)


def test_table_verdicts_curve_and_report(tmp_path, fakes):
    s = lift.rl_lift(_config(4), str(tmp_path / "l"), init="starter", seeds=2, algos=("care", "vanilla"), eval_every=2, progress=False)
    t = lift.table(s)
    assert "| start | 0 | 50.0% | 55.0% | 40.0% | 100.0 | 90.0 | 110.0 |" in t
    assert "| care, seed 1 | 4 | 54.0% | 59.0% | 44.0% | 92.0 | 82.0 | 102.0 |" in t and "| **vanilla, mean of 2 seeds** | 4 | 54.0%" in t
    v = lift.verdicts(s)
    assert v[0].startswith("care at step 4 (2 seeds): +4.0 points over the start (held-out templates +4.0); target +8: not met")
    # CARE 92 vs vanilla 98 tokens at equal success: -6.1% (successes 82 vs 88: -6.8%), not the -25% of the target
    assert v[2] == ("CARE vs vanilla: success +0.0 points, output tokens -6.1% (successful episodes -6.8%); "
                    "target (>= -2 points, <= -25%): not met")
    assert len(lift.curve_table(s).splitlines()) == 2 + 1 + 4 * 2  # header, rule, start, 4 arms x 2 points
    with open(s["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    page = open(s["report"], encoding="utf-8").read()
    assert page.count("<table") == 2 and "data:image/png;base64," in page and "target +8: not met" in page


def test_points_of_an_earlier_build_get_the_token_split_from_their_trajectories(tmp_path, fakes):
    """A curve point written without successes' / failures' tokens is completed from its eval trajectories."""
    from mpa_jax.envs import Trajectory, Verification, write_jsonl

    w = tmp_path / "lift"
    (w / "care-s0").mkdir(parents=True)
    (w / "care-s0" / "curve.jsonl").write_text(json.dumps({"step": 2, "episodes": 128.0, "success": 0.5, "success_seen": 0.5,
                                                           "success_held_out": 0.5, "output_tokens": 20.0, "tool_calls": 2.0}) + "\n")
    trajs = [Trajectory(task_id=t, tokens=[], loss_mask=[], logprobs=[], steps=[], verification=Verification(success=ok, score=float(ok)),
                        costs={"output_tokens": out}, provenance={}) for t, ok, out in (("a", True, 10), ("b", False, 30))]
    (w / "care-s0" / "eval" / "step_2" / "off").mkdir(parents=True)
    write_jsonl(str(w / "care-s0" / "eval" / "step_2" / "off" / "run0.jsonl"), trajs)
    s = lift.rl_lift(_config(2), str(w), init="starter", seeds=1, algos=("care",), eval_every=2, progress=False)
    p = s["arms"]["care"]["0"][0]
    assert fakes["rl"] == [] and (p["output_tokens_success"], p["output_tokens_failure"]) == (10.0, 30.0)
    assert "| care, seed 0 | 2 | 50.0% | 50.0% | 50.0% | 20.0 | 10.0 | 30.0 |" in lift.table(s)


def test_a_world_refresh_is_the_arms_start_and_a_row_of_its_own(tmp_path, fakes, monkeypatch):
    """With config.lift.refresh_steps > 0, every arm starts from one refresh of --init (made once, before any
    arm), the table shows it between the start and the arms, and the verdict says what RL added over it."""
    import mpa_jax.sft.world_refresh as wr

    made = []

    def world_refresh(config, checkpoint, out, *, worlds, per_template, steps, lr, progress):
        made.append((checkpoint, worlds, per_template, steps, lr))
        if not os.path.isdir(os.path.join(out, "sft", "hf")):  # an HF directory with a tokenizer (the arms are fitted to it)
            shutil.copytree(checkpoint, os.path.join(out, "sft", "hf"))
        return os.path.join(out, "sft", "hf"), {"tasks": 12, "worlds": worlds, "per_template": per_template, "steps": steps, "lr": lr,
                                                "train_loss": 0.1}

    monkeypatch.setattr(wr, "world_refresh", world_refresh)
    c = _config(4)
    c.lift.refresh_steps, c.lift.refresh_worlds = 30, 64
    w = str(tmp_path / "l")
    s = lift.rl_lift(c, w, init="starter", seeds=1, algos=("care",), eval_every=2, progress=False)
    assert made == [(STARTER, 64, int(c.lift.refresh_per_template), 30, float(c.lift.refresh_lr))]
    assert fakes["init"] == os.path.join(w, "refresh", "sft", "hf") and fakes["eval"][:2] == ["start", "refresh"]
    t = lift.table(s)
    assert "| start | 0 | 50.0% |" in t and "| world refresh (30 SFT steps, 12 demos in 64 worlds) | 0 | 60.0% |" in t
    # step 4: 54% = +4.0 over the start, -6.0 over the refresh (RL lost what the refresh gained)
    assert lift.verdicts(s)[0].startswith("care at step 4 (1 seed): +4.0 points over the start (held-out templates +4.0, "
                                          "RL over the refresh -6.0)")
    assert "| world refresh | 0 | 0 | 60.0% |" in lift.curve_table(s)


def test_turn_split_and_the_length_floor_in_the_verdicts():
    """Successes' generated tokens split into reasoning, tool-call turns and replies (failures left out); the floor is
    the tool calls plus the shortest reply per reply, and the verdicts say how much of the successes is above it."""
    from mpa_jax.envs import Trajectory, Verification

    call, think = 7, (20, 21)  # the ids that open a tool call and a think block in this test's token space

    def traj(ok: bool, turns: list[list[int]]) -> Trajectory:
        tokens, mask = [1, 2], [0, 0]  # a prompt
        for t in turns:
            tokens += t + [3]  # each turn, then a tool result / user message the planner did not write
            mask += [1] * len(t) + [0]
        return Trajectory(task_id="t", tokens=tokens, loss_mask=mask, logprobs=[0.0] * len(tokens), steps=[],
                          verification=Verification(success=ok, score=float(ok)), costs={}, provenance={})

    trajs = [traj(True, [[20, 8, 8, 8, 21, call, 5, 5, 5], [20, 21, 9, 9, 9, 9]]),  # 3 reasoning, 6 tool-call, a 6-token reply
             traj(True, [[call, 5], [call, 5], [9] * 10]),                      # 4 tool-call tokens, a 10-token reply
             traj(False, [[9] * 50])]                                           # a failure: not counted
    split = lift.turn_split(trajs, call, think)
    assert split == {"tool_call_tokens_success": 5.0, "reply_tokens_success": 8.0, "reasoning_tokens_success": 1.5,
                     "replies_success": 1.0, "shortest_reply": 6.0}
    assert lift.turn_split(trajs, call)["reasoning_tokens_success"] == 0.0  # no think ids: nothing counted as reasoning
    floor = lift.length_floor([split])
    assert floor["tokens"] == 14.5 and floor["max_cut"] == pytest.approx(1 - 11 / 14.5)
    start = {"step": 0, "success": 0.5, "success_seen": 0.5, "success_held_out": 0.5, "output_tokens": 20.0, **split}
    v = lift.verdicts({"start": start, "arms": {}})
    assert v == ["length floor (the arms' start): of the successful episodes' 14.5 output tokens 5.0 are tool calls and 1.5 reasoning, "
                 "the shortest reply has 6: a length term can cut successes by at most 24.1% without dropping a tool call"]
    assert lift.length_floor([{**split, "shortest_reply": None}]) is None  # a point without the split: no floor claimed


def test_the_reasoning_config_engages_care_and_leaves_vanilla_plain():
    """configs/rl_lift_think.py is configs/rl_lift.py with a reasoning refresh and CARE's length term on from
    competence 0; the vanilla arm of the same workdir differs in rl.algo only (its advantages have no length term;
    it keeps the lambda schedule so that both arms keep the same groups), so one command runs both arms."""
    from mpa_jax.rl.care import check_rl_config, lambda_schedule

    base, think = load_config_file("configs/rl_lift.py"), load_config_file("configs/rl_lift_think.py")
    assert (think.context.reasoning, think.lift.refresh_steps, think.rl.select_worlds) == ("full", 300, 256)
    care, vanilla = arm_config(think, "care", 1), arm_config(think, "vanilla", 1)
    check_rl_config(care.rl)
    assert float(lambda_schedule(0.4, care.rl)) > 0.75 > float(lambda_schedule(0.4, base.rl))  # this start's competence
    assert (vanilla.rl.algo, vanilla.seed) == ("vanilla", 1)
    assert {k: v for k, v in vanilla.rl.items() if k != "algo"} == {k: v for k, v in care.rl.items() if k != "algo"}
    for key in ("steps", "tasks_per_step", "group_size", "lr", "selection"):  # the same budget as the recipe
        assert think.rl[key] == base.rl[key], key
