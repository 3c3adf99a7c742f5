"""`mpa eval --split preregistered`: the pre-registered test set's first tasks of each part, by id, through the
real CLI, engine and sandbox (docs/preregistered.md)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mpa_eval_runs_the_preregistered_list(tmp_path, tmp_path_factory):
    from mpa_jax.eval.tasks import preregistered_tasks

    cache = str(tmp_path_factory.getbasetemp() / "mpa-jax-compile-cache")  # shared with test_eval_cli / test_loop
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0",
               JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    out = tmp_path / "e"
    res = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "eval", "--config", os.path.join(ROOT, "configs", "micro.py"),
                          "--workdir", str(tmp_path / "run"), "--checkpoint", "untrained", "--split", "preregistered",
                          "--seen", "2", "--held-out", "1", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads((out / "eval.json").read_text())
    assert rep["split"] == "preregistered" and rep["tasks"] == 3
    ran = [json.loads(line)["task_id"] for f in sorted((out / "off").glob("*.jsonl")) for line in open(f)]
    want = [t.id for t in preregistered_tasks("seen")[:2] + preregistered_tasks("held_out")[:1]]
    assert sorted(ran) == sorted(want)
    by = rep["harness"]["off"]["by_templates"]
    assert by["seen"]["runs"] + by["held_out"]["runs"] == 3
