"""`mpa eval` with stdout not a terminal: named start-up phase and plain episode progress lines; the
figures of eval.json also land in TensorBoard (`<out>/tb`, read back with TensorBoard's own reader)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_eval_logs_progress_and_writes_tensorboard(tmp_path, tmp_path_factory):
    cache = str(tmp_path_factory.getbasetemp() / "mpa-jax-compile-cache")  # shared with test_eval_cli/test_loop
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0",
               JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    res = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "eval", "--config", os.path.join(ROOT, "configs", "micro.py"),
                          "--workdir", str(tmp_path / "run"), "--checkpoint", "untrained", "--max-tasks", "2",
                          "--config.progress.every_s=0", "--config.progress.first_s=0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert "eval: building the engine..." in lines and any(x.startswith("eval: building the engine: done in ") for x in lines)
    steps = [x for x in lines if re.match(r"eval eval/off(/0)?: episode ", x)]  # the run's label: eval/<mode>[/<run>]
    assert steps and re.match(r"eval eval/off(/0)?: episode 2/2 \(100%\)", steps[-1]) and "success " in steps[-1], res.stdout
    assert "\x1b[" not in res.stdout  # no terminal control codes in a log

    out = tmp_path / "run" / "eval" / "untrained"
    rep = json.loads((out / "eval.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/off/overall/success" in tags and "eval/off/overall/mean_output_tokens" in tags
    got = acc.Scalars("eval/off/overall/mean_output_tokens")
    assert len(got) == 1 and abs(got[0].value - rep["harness"]["off"]["overall"]["mean_output_tokens"]) < 1e-3
