"""`mpa loop` end to end on configs/micro.py: two rounds, killed with SIGKILL once the untrained model's
evaluation is recorded and run again (it must continue, not redo), then summary.json, the datasheets, the
final HF export and the report. (~45 s of CPU; the generous timeouts are for a loaded shared machine.)"""
import json
import os
import signal
import subprocess
import sys

from mpa_jax.loop import STATE_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(cache):
    env = dict(os.environ)
    # one host device (the micro model needs no sharding) and a compilation cache the resumed run reuses
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", MPA_HUGE_PAGES="0")
    return env


# `mpa loop` whose LoopState.record SIGKILLs the process once "eval/untrained" is saved.
_KILL_AFTER_UNTRAINED_EVAL = """
import os, signal, sys
from mpa_jax import cli, loop
record = loop.LoopState.record
def record_then_die(self, name, result, skipped=None):
    record(self, name, result, skipped)
    if name == "eval/untrained":
        os.kill(os.getpid(), signal.SIGKILL)
loop.LoopState.record = record_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_two_round_loop_killed_and_resumed(tmp_path, tmp_path_factory):
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "mpa_jax.cli", "loop", "--config", os.path.join(ROOT, "configs", "micro.py"), "--workdir", str(workdir)]
    env = _env(tmp_path_factory.getbasetemp() / "mpa-jax-compile-cache")  # shared with test_eval_cli
    state = workdir / STATE_FILE
    # The first run kills itself (SIGKILL) right after the untrained evaluation's stage is recorded: the
    # kill lands exactly at that stage boundary, with no polling (the driver wraps LoopState.record).
    first_cmd = [sys.executable, "-c", _KILL_AFTER_UNTRAINED_EVAL, *cmd[3:]]
    proc = subprocess.run(first_cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    out1 = proc.stdout
    assert proc.returncode == -signal.SIGKILL, f"the first run was not killed (rc {proc.returncode}):\n" + out1[-3000:]
    first = json.loads(state.read_text())
    assert first["order"][-1] == "eval/untrained" and "export" not in first["done"]
    untrained_run = workdir / "eval" / "untrained" / "off" / "run0.jsonl"
    mtime = untrained_run.stat().st_mtime_ns

    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    summary = json.loads((workdir / "summary.json").read_text())
    # continued, not redone
    assert set(first["done"]) <= set(summary["resumed_stages"])
    assert untrained_run.stat().st_mtime_ns == mtime
    assert "resume: stage eval/untrained already done" in res.stdout
    # held-out success for untrained, after SFT and after each round, overall and per category, with versions
    assert [s["name"] for s in summary["stages"]] == ["untrained", "SFT", "round 1", "round 2"]
    for s in summary["stages"]:
        # eval.max_tasks 4 stratified tasks: four different categories of the five
        assert 0.0 <= s["success"] <= 1.0 and len(s["by_category"]) == 4
        assert set(s["by_category"]) <= {"Tool Use", "Memory", "Skills", "Sub-agent", "Follow-up"}
        assert s["weight_version"] and s["harness_version"]
        assert os.path.exists(s["eval_json"])
    assert summary["stages"][0]["weight_version"] == "init"
    skipped = {s["stage"]: s["reason"] for s in summary["skipped"]}
    assert "r1/rl" not in skipped and "r2/rl" not in skipped
    # the refresh rounds trained from the previous export
    st = json.loads(state.read_text())["done"]
    assert st["r1/refresh"]["steps"] == 2 and st["r2/refresh"]["export_dir"].endswith("r2/refresh/hf")
    assert st["r1/data"]["weights"] and abs(sum(st["r1/data"]["weights"].values()) - 1.0) < 1e-9
    # RL (loop.rl_tasks = "select") trains on fresh instances of train templates chosen by competence, and
    # keeps all its rollouts (the groups without signal too), whose outcomes join the probe's in the next
    # data stage's competence
    from mpa_jax.envs import Task, Trajectory, read_jsonl
    from mpa_jax.eval import held_out_templates

    constructed = {t.id for t in read_jsonl(st["r0/data"]["tasks_path"], Task)}
    assert len(constructed) == st["r0/data"]["constructed"] > 0
    rollouts = [t for f in sorted(os.listdir(st["r1/rl"]["rollouts_dir"]))
                for t in read_jsonl(os.path.join(st["r1/rl"]["rollouts_dir"], f), Trajectory)]
    assert len(rollouts) == 2 * 2  # rl.tasks_per_step groups of rl.group_size, select_tries 1
    assert all(t.task_id.startswith("train/rl/") and t.task_id.split("/")[2] not in held_out_templates() for t in rollouts)
    probe = read_jsonl(str(workdir / "data" / "r1" / "policy.jsonl"), Trajectory)
    scored = [t for t in probe + rollouts if not t.infra_failure and t.verification is not None]
    counted = sum(int(c["n"]) for c in st["r1/data"]["competence"].values())
    assert counted == len(scored)
    assert len(summary["datasheets"]) == 3 and all(os.path.exists(p) for p in summary["datasheets"])
    assert (workdir / "harness" / "r2" / "failure_clusters.json").exists()
    assert json.loads((workdir / "final" / "config.json").read_text())["vocab_size"] == 512
    assert (workdir / "final" / "tokenizer.json").exists() or any(f.startswith("tokenizer") for f in os.listdir(workdir / "final"))
    html = (workdir / "report.html").read_text()
    assert html.count('<img class="plot"') >= 4 and "round 2" in html
    assert "greedy success on the same 4 held-out test tasks" in res.stdout and "report:" in res.stdout
    # seen / held-out templates split out per stage (counts add up to the evaluated tasks)
    assert "seen tmpl" in res.stdout and "held-out tmpl" in res.stdout
    for s in summary["stages"]:
        assert s["tasks_seen"] + s["tasks_held_out"] == 4


def test_make_demo_is_the_loop_on_the_embedded_default():
    """`make demo` runs `mpa loop` on configs/tiny.py (the command the two-round test above exercises on
    the micro config); its headline lists untrained | starter | SFT | rounds on seen and held-out templates."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        lines = f.read().split("\ndemo:", 1)[1].split("\n\n", 1)[0].splitlines()
    recipe = [ln.strip() for ln in lines[1:] if ln.startswith("\t")]
    assert recipe == ["$(BIN)/mpa loop --config configs/tiny.py --workdir runs/demo"], recipe
    from mpa_jax.config import load_config_file

    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny.py"))
    assert cfg.loop.starter == "starter" and cfg.loop.eval_split == "preregistered"
    assert cfg.loop.eval_seen > 0 and cfg.loop.eval_held_out > 0 and cfg.loop.rounds >= 1
