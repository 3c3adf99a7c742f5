"""The benches that compare with transformers run end to end at small sizes (they exit non-zero when
our numbers disagree with transformers'), so that they still work when a session runs them for real."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(*args: str) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0")
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


def test_forward_bench_small():
    """Our loss equals transformers' on the bench's batch, and one ratio per attention implementation."""
    out = _bench("bench/forward.py", "--layers", "1", "--seq", "64", "--batch", "2", "--vocab", "512",
                 "--steps", "1", "--rounds", "1", "--threads", "1")
    ratios = re.findall(r"transformers attn=(\w+) .* ratio ours/torch: ([\d.]+)x", out)
    assert [a for a, _ in ratios] == ["eager", "sdpa"], out
    assert all(float(r) > 0 for _, r in ratios)


def test_models_accel_bench_dry_run():
    """The accelerator check's dry run: our bfloat16 logits are as close to transformers' float32 ones
    as transformers' own bfloat16 logits (within 2x), for every parity config, and the timed step runs."""
    out = _bench("bench/models_accel.py", "--steps", "1")
    lines = re.findall(r"parity (\w+) .* ours bf16 ([\d.e+-]+), transformers bf16 \(cpu\) ([\d.e+-]+), .* (ok|FAIL)", out)
    assert len(lines) == 3 and all(status == "ok" for *_, status in lines), out
    assert re.search(r"fwd\+bwd cpu attention=xla batch 2 x 128: [\d.]+ ms/step", out), out


def test_serve_bench_small():
    """bench/serve.py at a toy size: both batchers (per engine call, per decode chunk) serve every client
    through the official openai client and it prints one row per batcher and concurrency."""
    out = _bench("bench/serve.py", "--concurrency", "1", "2", "--requests", "1", "--new", "4", "--hidden", "64",
                 "--layers", "1", "--intermediate", "128", "--slot-len", "64")
    rows = re.findall(r"^\s*(call|slots)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      out, re.M)
    assert [(k, c) for k, c, *_ in rows] == [("call", "1"), ("call", "2"), ("slots", "1"), ("slots", "2")], out
    assert all(float(x) > 0 for *_, rps, tps, _p50, _p99, rr, rt, ratio in rows for x in (rps, tps, rr, rt, ratio)), out


def test_rl_step_gpu_script_dry_run():
    """The lent-GPU RL iteration script (`bench/rl_step.py --shape qwen3_1_7b --device gpu`) runs its whole
    path (recipe flags: bf16, scanned layers, remat; embedded engine; budgeted update; sync) at a tiny
    width on CPU and says where the time goes; `--device gpu` without a GPU exits 2 with one line."""
    out = _bench("bench/rl_step.py", "--shape", "qwen3_1_7b", "--dry-run", "--device", "cpu", "--prompt-len", "24",
                 "--completion-len", "8", "--tasks", "2", "--group", "2", "--iters", "1")
    assert re.search(r"^ours: generate_s [\d.]+ .*train_device_s [\d.]+ .*sync_s [\d.]+ .*first_s [\d.]+", out, re.M), out
    assert re.search(r"where the time goes: generate \d+%, train_host \d+%, train_device \d+%, sync \d+% of", out), out
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0")
    res = subprocess.run([sys.executable, "bench/rl_step.py", "--shape", "qwen3_1_7b", "--device", "gpu"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 2 and "--device gpu: JAX's backend is cpu" in res.stderr


def test_rl_lift_gpu_script_dry_run(tmp_path):
    """The lent-GPU RL-lift script (`bench/rl_lift_gpu.py --smoke`, issue 28 item 5) runs every stage at a tiny
    width on CPU: the plan, the random start at the recipe's flags with the starter's tokenizer, one CARE arm
    of `mpa experiment rl-lift` with its evaluations, and the estimate of the whole experiment from them."""
    import json

    _bench("bench/rl_lift_gpu.py", "--workdir", str(tmp_path), "--smoke", "--dry-run", "--device", "cpu", "--skip", "rl-step")
    fig = json.loads((tmp_path / "figures.json").read_text())
    assert fig["plan"]["config"] == "rl_lift_gpu" and fig["plan"]["devices"] == 1, fig["plan"]
    lift = fig["lift"]
    assert "error" not in lift, lift
    assert lift["start_eval"]["tasks"] == 6 and lift["step_eval"]["tasks"] == 6, lift
    assert lift["rl"]["steps"] == 1 and lift["rl"]["groups_drawn"] >= 2 and lift["rl"]["rollout_s"] > 0, lift["rl"]
    est = fig["estimate"]
    assert est["eval_s"] > 0 and est["rl_rollout_s"] > 0 and est["tokens_per_episode"] == 110.4, est
