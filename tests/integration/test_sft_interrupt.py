"""SIGTERM on a real `mpa sft` process: it saves at the next step boundary, exits 130 with one line and
no traceback, and the same command resumes to exactly the uninterrupted run (losses per step, each step
logged once in metrics.jsonl and in TensorBoard). Also: progress lines when stdout is a pipe, the
data report, and a re-run of a finished SFT saying so."""
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np

from mpa_jax.sft.synthetic import write_trajectories

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-m", "mpa_jax.cli"]
STEPS = 40
FLAGS = [
    "--config.model.vocab_size=256", "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
    "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2", "--config.model.num_key_value_heads=1",
    "--config.model.head_dim=16", "--config.model.logprob_chunk=128", "--config.sft.seq_len=40", "--config.sft.batch_size=8",
    f"--config.sft.steps={STEPS}", "--config.sft.warmup_steps=1", "--config.sft.log_every=1", "--config.sft.only_success=false",
    "--config.sft.eval_fraction=0.0", "--config.checkpoint.every=1000", "--config.checkpoint.async_save=false",
    "--config.progress.every_s=0", "--config.progress.first_s=0",  # a progress line per step: what the test waits on
]
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")


def _cmd(data, workdir, *extra):
    return MPA + ["sft", "--data", data, "--workdir", workdir, *FLAGS, *extra]


def _losses(workdir):
    rows = [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl"))]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


def _tb_losses(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(workdir, "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


def test_sigterm_saves_exits_with_one_line_and_resumes_exactly(tmp_path):
    data = write_trajectories(str(tmp_path / "d.jsonl"), 40, 256, seed=41)
    ref = str(tmp_path / "ref")
    done = subprocess.run(_cmd(data, ref), capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # stdout is a pipe: named start-up phases and plain progress lines, no rich bar
    assert "sft: compiling the train step (and running step 1)..." in done.stdout
    reports = [x for x in done.stdout.splitlines() if x.startswith("sft: data: of 40 examples, ")]
    assert len(reports) == 1 and "truncated to sft.seq_len=40 tokens" in reports[0], done.stdout  # said once
    assert re.search(rf"sft: step {STEPS}/{STEPS} \(100%\) .* step/s .*ETA 0s  loss ", done.stdout), done.stdout[-2000:]

    run = str(tmp_path / "run")
    proc = subprocess.Popen(_cmd(data, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    try:
        for line in proc.stdout:  # wait for training to be under way (step 3 logged), then signal
            if line.startswith("sft: step 3/"):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    final = [x for x in err.splitlines() if x.startswith("interrupted")]
    assert len(final) == 1, err
    saved = int(re.match(r"interrupted \(SIGTERM\): saved step (\d+) in ", final[0]).group(1))
    assert 3 <= saved < STEPS  # stopped at the next step boundary, not at the end
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == [str(saved)]
    assert [s for s, _ in _losses(run)] == list(range(1, saved + 1))

    resumed = subprocess.run(_cmd(data, run), capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"restoring checkpoint step {saved}" in resumed.stdout
    assert f"compiling the train step (and running step {saved + 1})" in resumed.stdout
    want = _losses(ref)
    got = _losses(run)
    assert [s for s, _ in got] == list(range(1, STEPS + 1))  # each step once
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)
    tb = _tb_losses(run)  # what TensorBoard shows agrees with metrics.jsonl
    assert [s for s, _ in tb] == [s for s, _ in got]
    np.testing.assert_allclose([v for _, v in tb], [v for _, v in got], rtol=1e-6)

    again = subprocess.run(_cmd(data, run), capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete" in again.stdout and "nan" not in again.stdout
    assert f"train loss {got[-1][1]:.4f}" in again.stdout
    assert _losses(run) == got  # nothing logged again


def test_sft_data_report_names_counts_and_reasons():
    """The line loading prints: how many examples were cut to seq_len and dropped, and why."""
    from mpa_jax.sft.data import DataStats
    from mpa_jax.sft.trainer import data_report

    line = data_report(DataStats(lines=380, train_lines=361, eval_lines=19, dropped_infra=2, dropped_failed=3, truncated=27), 2048, True)
    assert line == ("data: of 380 examples, 27 truncated to sft.seq_len=2048 tokens (their tails are not trained; raise"
                    " config.sft.seq_len to keep them); 5 dropped (2 infra failures, 3 unsuccessful episodes"
                    " (config.sft.only_success=True))")
    assert data_report(DataStats(lines=10, train_lines=10), 64, False) == ""
