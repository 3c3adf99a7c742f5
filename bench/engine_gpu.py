"""The engine on an accelerator at Qwen3-1.7B shape (random weights, bf16): compiled programs and their
compile time, decode tokens/s at batch 1 / 32 / 256 against the memory-bandwidth roofline, one RL iteration.

    python bench/engine_gpu.py                       # an H100 / H200 (--hbm-tbs: its bandwidth, TB/s)
    python bench/engine_gpu.py --dry-run             # a tiny width/depth on CPU (checks the path)

Prepared, not yet run on a device (no accelerator was lent to issue 49). Per batch B: B prompts of
`--prompt` tokens (1,024) then `--new` tokens (256) each, greedy; decode tok/s = new tokens / the engine's
decode seconds (`stats()["decode_s"]`, the chunk programs' wall time, prefill excluded). The roofline of a
decode step reads the weights once plus every row's keys/values (layers x KV heads x head_dim x 2 (k, v) x
2 bytes x the row's mean length), so tok/s <= B x bandwidth / bytes per step; target >= 50% at B >= 64.
The RL iteration is `bench/rl_step.py --shape qwen3_1_7b` (its own figures), run after.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="memory bandwidth, TB/s (H200 4.8, H100 SXM 3.35)")
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--skip-rl", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import jax
    import numpy as np

    from mpa_jax import models
    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.engine import Engine
    from mpa_jax.rollout.types import SamplingParams

    config = load_config_file(os.path.join(ROOT, "configs", "qwen3_1_7b.py"))
    cfg = models.config_from_ml(config.model).replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    if args.dry_run:
        cfg = cfg.replace(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, vocab_size=512)
        args.batches, args.prompt, args.new = [1, 4], 64, 16
    print(f"device {jax.devices()[0].device_kind} x{jax.device_count()}; {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{models.param_count(cfg) / 1e9:.2f} B params", flush=True)
    params = models.init_params(cfg, jax.random.key(0))
    weight_bytes = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(params))
    kv_per_token = cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * 2
    top = max(args.batches)
    engine = Engine(cfg, params, slots=top, slot_len=args.prompt + args.new, max_batch=top, max_prefill=16,
                    prefill_chunk=args.prefill_chunk)
    rng = np.random.default_rng(0)
    sp = SamplingParams(max_new_tokens=args.new, temperature=0.0)
    for b in args.batches:
        prompts = [rng.integers(1, cfg.vocab_size, args.prompt).tolist() for _ in range(b)]
        for _ in range(2):  # compiles (cache off: every prompt prefilled; a second call may land on other slots)
            engine.generate_batch(prompts, sp, list(range(b)))
        s0 = engine.stats()
        t0 = time.perf_counter()
        out = engine.generate_batch(prompts, sp, list(range(b)))
        wall = time.perf_counter() - t0
        s1 = engine.stats()
        tokens = sum(len(r.token_ids) for r in out)
        decode_s = s1["decode_s"] - s0["decode_s"]
        mean_len = args.prompt + args.new / 2
        step_bytes = weight_bytes + kv_per_token * mean_len * b
        roof = b * args.hbm_tbs * 1e12 / step_bytes
        print(f"batch {b:>4}: decode {tokens / decode_s:>9.0f} tok/s (roofline {roof:>9.0f}, {100 * tokens / decode_s / roof:5.1f}%), "
              f"wall {wall:.1f} s incl. prefill of {b * args.prompt} tokens", flush=True)
    s = engine.stats()
    print(f"programs {int(s['programs'])}, XLA compilations {int(s['compiles'])} in {s['compile_s']:.1f} s", flush=True)
    engine.close()
    if not args.skip_rl:
        cmd = [sys.executable, os.path.join(ROOT, "bench", "rl_step.py"), "--shape", "qwen3_1_7b", "--skip-trl", "--iters", "1"]
        if args.dry_run:
            cmd += ["--dry-run", "--device", "any"]
        print("RL iteration: " + " ".join(cmd), flush=True)
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
