"""`mpa eval`: eval.json with pass@1, pass@k and pass^k over k sampled runs (the one sampled mode) and the cost
figures; bad input exits 2."""
import json
import os
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cache(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "mpa-jax-compile-cache")  # shared with test_loop


def _mpa(tmp_path, cache, *args):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0",
               JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return subprocess.run([sys.executable, "-m", "mpa_jax.cli", "eval", "--config", os.path.join(ROOT, "configs", "micro.py"),
                           "--workdir", str(tmp_path / "run"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_eval_writes_metrics_for_k_runs(tmp_path, cache):
    modes = ["off", "on"]  # --harness both: the same checkpoint with and without the harness
    res = _mpa(tmp_path, cache, "--checkpoint", "untrained", "--k", "2", "--max-tasks", "2", "--harness", "both")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads((tmp_path / "run" / "eval" / "untrained" / "eval.json").read_text())
    assert rep["k"] == 2 and rep["tasks"] == 2 and rep["split"] == "test" and not rep["greedy"]
    assert sorted(rep["harness"]) == sorted(modes)
    assert "harness_delta_success" in rep and "harness on - off" in res.stdout
    on = [json.loads(line) for line in open(tmp_path / "run" / "eval" / "untrained" / "on" / "sampled.jsonl")]
    assert all(t["provenance"]["harness_version"] not in ("", "none") for t in on)
    m = rep["harness"]["off"]
    o = m["overall"]
    assert o["runs"] + m["infra_failures"] == 4
    assert len(on) == 4 and rep["ks"] == [1, 2] and rep["temperature"] > 0  # each task twice, sampled
    for key in ("success", "partial_score", "pass@1", "pass@2", "pass^2", "mean_output_tokens", "mean_tool_calls", "cost_per_1k_tasks_output_only"):
        assert key in o
    assert o["pass^2"] <= o["pass@1"] <= o["pass@2"] and o["mean_output_tokens"] > 0
    c = o["cost_per_1k_tasks"]
    assert set(c) == {"input_tokens", "output_tokens", "tool_calls", "device_seconds", "total"}
    assert c["input_tokens"] > 0 and c["output_tokens"] > 0 and c["total"] > o["cost_per_1k_tasks_output_only"]
    assert set(m["by_category"]) <= {"Tool Use", "Memory", "Skills", "Sub-agent", "Follow-up"} and m["by_domain"]
    assert "output tokens only" in res.stdout and "pass^2" in res.stdout and "pass@2" in res.stdout


def test_eval_bad_input_exits_2(tmp_path, cache):
    res = _mpa(tmp_path, cache, "--checkpoint", str(tmp_path / "nope"))
    assert res.returncode == 2 and f"no checkpoint at {tmp_path / 'nope'}" in res.stderr and res.stderr.count("\n") == 1
    res = _mpa(tmp_path, cache, "--checkpoint", "untrained", "--harness", "sometimes")
    assert res.returncode == 2 and "--harness must be one of" in res.stderr
    res = _mpa(tmp_path, cache, "--checkpoint", "untrained", "--samples", "2", "--pass-k", "3")
    assert res.returncode == 2 and "k=3" in res.stderr and res.stderr.count("\n") == 1
