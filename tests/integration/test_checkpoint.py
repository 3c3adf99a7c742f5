"""Checkpoints: exact resume, keep-N, SIGKILL during a save, loud errors on corrupt or incompatible ones."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mpa_jax.config import load_config_file
from mpa_jax.sft import run_sft
from mpa_jax.sft.synthetic import tiny_test_config, write_trajectories
from mpa_jax.train import CheckpointError, read_metrics

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(steps=6, every=2, keep=3):
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), steps=steps)
    c.checkpoint.every, c.checkpoint.keep = every, keep
    return c


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_trajectories(str(tmp_path_factory.mktemp("data") / "d.jsonl"), 64, 256, seed=11)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted 6-step run."""
    return run_sft(_config(), str(tmp_path_factory.mktemp("ref")), data, progress=False)


def test_interrupted_and_resumed_run_repeats_the_uninterrupted_losses(data, reference, tmp_path):
    first = run_sft(_config(), str(tmp_path), data, max_steps=3, progress=False)
    assert first.steps == 3 and first.resumed_from is None
    second = run_sft(_config(), str(tmp_path), data, progress=False)
    assert second.resumed_from == 3  # the final step of a stopped run is always saved
    np.testing.assert_allclose(first.losses + second.losses, reference.losses, rtol=1e-6)
    assert reference.losses[-1] < reference.losses[0]
    # keep-N: saves at 2, 3, 4, 6 with keep=3 -> the last three remain
    steps = sorted(int(d) for d in os.listdir(second.checkpoint_dir) if d.isdigit())
    assert steps == [3, 4, 6]


def test_sigkill_during_a_save_resumes_from_the_last_complete_checkpoint(data, reference, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        from mpa_jax.config import load_config_file
        from mpa_jax.sft import run_sft
        from mpa_jax.sft.synthetic import tiny_test_config
        c = tiny_test_config(load_config_file({os.path.join(ROOT, 'configs/tiny.py')!r}), steps=6)
        c.checkpoint.every, c.checkpoint.keep = 2, 3
        def hook(step):
            if step == 4:  # the async save of step 4 has started: die now, hard
                os.kill(os.getpid(), signal.SIGKILL)
        run_sft(c, {str(tmp_path)!r}, {data!r}, on_save_started=hook, progress=False)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    ck = os.path.join(str(tmp_path), "checkpoints")
    complete = sorted(int(d) for d in os.listdir(ck) if d.isdigit())
    assert complete == [2]  # step 4 was being written when the process died: not complete, not visible
    assert any(d.startswith("4.") for d in os.listdir(ck))  # its temporary directory is what is left
    resumed = run_sft(_config(), str(tmp_path), data, progress=False)
    start = resumed.resumed_from
    assert start == 2
    assert sorted(d for d in os.listdir(ck)) == ["2", "4", "6"]  # the partial step-4 directory was cleaned up
    np.testing.assert_allclose(resumed.losses, reference.losses[start:], rtol=1e-6)
    logged = [r["step"] for r in read_metrics(resumed.metrics_path) if "train/loss" in r]
    assert logged[-1] == 6


def test_incompatible_checkpoint_names_what_differs(data, reference, tmp_path):
    import shutil

    shutil.copytree(reference.checkpoint_dir, os.path.join(str(tmp_path), "checkpoints"))
    c = _config()
    c.model.hidden_size = 48
    with pytest.raises(CheckpointError, match="hidden_size is 32 in the checkpoint but 48 in this run"):
        run_sft(c, str(tmp_path), data, progress=False)
    other = write_trajectories(str(tmp_path / "other.jsonl"), 64, 256, seed=12)
    with pytest.raises(CheckpointError, match="data.fingerprint"):
        run_sft(_config(), str(tmp_path), other, progress=False)


def test_corrupt_checkpoint_gets_a_clear_error(data, reference, tmp_path, monkeypatch):
    """One clear error, and nothing after it: the reads orbax abandons when the restore fails must
    not report 'Event loop is closed' tracebacks (they did, 41 of them, through sys.unraisablehook).
    Those reads finish on tensorstore's threads at a time of their own; instead of waiting for them,
    the test feeds the installed hook the report they make (controlled, no sleep)."""
    import shutil
    from types import SimpleNamespace

    dst = os.path.join(str(tmp_path), "checkpoints")
    shutil.copytree(reference.checkpoint_dir, dst)
    state_dir = os.path.join(dst, "6", "state")
    damaged = 0
    for root, _, files in os.walk(state_dir):
        for f in files:
            if not f.endswith((".txt", "_METADATA")):
                with open(os.path.join(root, f), "r+b") as fh:
                    fh.write(b"\x00garbage\x00" * 8)
                damaged += 1
    assert damaged
    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    with pytest.raises(CheckpointError, match=r"checkpoints/6 .*corrupt"):
        run_sft(_config(), str(tmp_path), data, progress=False)
    hook = sys.unraisablehook
    assert getattr(hook, "drops_abandoned_reads", False), "the failed restore left no filter for its abandoned reads"

    def report(message):
        return SimpleNamespace(exc_type=RuntimeError, exc_value=RuntimeError(message), exc_traceback=None,
                               err_msg=None, object=None)

    hook(report("Event loop is closed"))  # what each abandoned read reports when it completes
    assert not reports, [str(r.exc_value) for r in reports[:3]]
    other = report("a real fault")
    hook(other)  # any other unraisable exception still reaches the previous hook
    assert reports == [other]
