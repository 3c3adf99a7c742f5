"""`mpa demo` (what `make demo` runs): the whole path end to end, at a few steps so the suite stays fast."""
import json
import subprocess
import sys
from pathlib import Path

from mpa_jax.commands.demo import tool_call_outcomes
from mpa_jax.eval import stratified
from mpa_jax.envs import Action, Feedback, ErrorCode, Step, Trajectory, load_tasks, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_stratified_sample_covers_every_domain_and_category_first():
    tasks = load_tasks("dev")
    cells = {(t.domain, t.category) for t in tasks}
    sample = stratified(tasks, len(cells))
    assert {(t.domain, t.category) for t in sample} == cells
    domains = {d for d, _ in cells}
    first = stratified(tasks, len(domains))
    assert {t.domain for t in first} == domains
    assert len({t.category for t in first}) == len({c for _, c in cells})
    assert len({t.id for t in stratified(tasks, 100)}) == 100
    assert stratified(tasks, 10) == stratified(tasks, 10)


def test_tool_call_outcomes_counts_by_feedback(tmp_path):
    steps = [
        Step(Action.tool_call("a", {}), Feedback(call_id="1", status="ok")),
        Step(Action.tool_call("b", {}), Feedback.error(ErrorCode.UNKNOWN_TOOL, "no such tool")),
        Step(Action.tool_call("c", {}), Feedback.error(ErrorCode.UNKNOWN_TOOL, "no such tool")),
        Step(Action.message("done"), None),
    ]
    path = tmp_path / "r.jsonl"
    write_jsonl(str(path), [Trajectory(task_id="t", tokens=[], loss_mask=[], logprobs=[], steps=steps)])
    assert tool_call_outcomes(str(path)) == {"ok": 1, "UNKNOWN_TOOL": 2}


def test_demo_runs_end_to_end(tmp_path):
    workdir = tmp_path / "demo"
    args = [
        sys.executable, "-m", "mpa_jax.cli", "demo", "--config", str(ROOT / "configs" / "tiny.py"),
        "--workdir", str(workdir), "--eval-tasks", "2", "--eval-held-out", "1",
        "--config.oracle.max_tasks=16", "--config.sft.steps=2", "--config.sft.warmup_steps=1",
        "--config.demo.refresh_tasks=16", "--config.demo.refresh_steps=2", "--config.demo.refresh_warmup=1",
        "--config.sft.eval_every=2", "--config.checkpoint.every=2",
        "--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=8",
    ]
    res = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((workdir / "demo_summary.json").read_text())
    assert report["tasks"] == 3 and report["tasks_seen_templates"] == 2 and report["tasks_held_out_templates"] == 1
    starter = (ROOT / "starter" / "datasheet.json").exists()
    assert report["columns"] == (["untrained", "starter", "starter+SFT"] if starter else ["untrained", "SFT"])
    for name, row in report["results"].items():
        assert 0.0 <= row["success_rate"] <= 1.0
        assert set(row["metrics"]) >= {"success", "success_seen", "success_held_out"}
    for name in ("untrained", "sft") + (("starter",) if starter else ()):
        assert (workdir / "rollouts" / f"{name}.jsonl").exists()
    assert (Path(report["export_dir"]) / "config.json").exists()
    assert "untrained" in res.stdout and "SFT" in res.stdout and "held-out templates" in res.stdout


def test_demo_without_starter_directory_is_one_clear_error(tmp_path):
    args = [sys.executable, "-m", "mpa_jax.cli", "demo", "--config", str(ROOT / "configs" / "tiny.py"),
            "--workdir", str(tmp_path / "demo"), "--starter", str(tmp_path / "nowhere")]
    res = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 2 and "nowhere" in res.stderr and len(res.stderr.strip().splitlines()) == 1
