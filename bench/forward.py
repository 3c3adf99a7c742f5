"""Forward+backward tokens/s of our Qwen3 vs transformers (torch, eager) on the same config and batch.

Both compute next-token cross-entropy from full logits and its gradient with respect to every
parameter (no optimizer step), on the same weights (the losses must agree), using all CPU cores or
one (--threads 1). transformers runs once per attention implementation in --torch-attn (default:
both its `eager` attention and its default `sdpa`), alternating with ours in the same process.
Prints each figure and the ratio (ours / torch; > 1 means faster than torch). --compute-dtype
bfloat16 runs ours with float32 weights and bfloat16 compute and torch under CPU autocast to
bfloat16. --profile adds our step's XLA ops by kind.

    taskset -c 1 .venv/bin/python bench/forward.py --steps 3 --threads 1 [--profile]
    .venv/bin/python bench/forward.py --steps 3 [--torch-attn sdpa] [--compute-dtype bfloat16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up)")
    ap.add_argument("--remat", default="none")
    ap.add_argument("--threads", type=int, default=0, choices=(0, 1), help="1: one CPU thread for both; 0: all cores")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds; the best of each is kept")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="cpu: process CPU time (steadier on a shared machine; use with --threads 1)")
    ap.add_argument("--torch-attn", default="eager,sdpa", help="transformers attn_implementation(s), comma-separated")
    ap.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--profile", action="store_true", help="also print our step's XLA ops by kind (ms per step)")
    args = ap.parse_args()
    from mpa_jax import hostmem

    hostmem.reexec_with_huge_pages([sys.executable, __file__, *sys.argv[1:]])  # as `mpa` runs (applies to torch too)
    threads = args.threads or len(os.sched_getaffinity(0))
    if args.threads == 1:
        # XLA:CPU reads this flag at start-up, so it is set before jax is imported.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from mpa_jax import models

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        tie_word_embeddings=True,
        max_position_embeddings=max(4096, args.seq),
    )
    attn_impls = [a.strip() for a in args.torch_attn.split(",") if a.strip()]
    hf = transformers.Qwen3ForCausalLM(hf_cfg)
    hf.train()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = models.from_pretrained(d, dtype="float32", compute_dtype=args.compute_dtype, remat=args.remat)
    cfg, params = ours.cfg, ours.params
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.vocab, (args.batch, args.seq + 1))
    tokens = args.batch * args.seq

    # --- torch eager ---
    t_in = torch.as_tensor(ids[:, :-1])
    t_lab = torch.as_tensor(ids[:, 1:])

    bf16 = args.compute_dtype == "bfloat16"

    def torch_step(attn: str) -> float:
        hf.config._attn_implementation = attn
        hf.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = hf(input_ids=t_in).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab).float(), t_lab.reshape(-1))
        loss.backward()
        return float(loss.detach())

    # --- ours (jit) ---
    j_in = jnp.asarray(ids[:, :-1], jnp.int32)
    j_lab = jnp.asarray(ids[:, 1:], jnp.int32)

    def loss_fn(p):
        # Cross-entropy as logsumexp - target logit (what torch's cross_entropy computes): the
        # gradient is softmax - onehot without materialising the [B, T, V] log-softmax.
        logits = models.forward(cfg, p, j_in)
        picked = jnp.take_along_axis(logits, j_lab[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    step = jax.jit(jax.value_and_grad(loss_fn))

    def jax_step() -> float:
        loss, grads = jax.block_until_ready(step(params))
        return float(loss)

    # Same work on both sides: the losses must agree (bfloat16 rounds differently on each side).
    loss_jax = jax_step()
    losses = {attn: torch_step(attn) for attn in attn_impls}
    tol = 1e-2 if bf16 else 1e-4
    for attn, loss_torch in losses.items():
        if abs(loss_torch - loss_jax) > tol * abs(loss_torch):
            raise SystemExit(f"losses differ: torch ({attn}) {loss_torch} vs ours {loss_jax}")

    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def timeit(fn) -> float:
        fn()  # warm-up (and compile)
        times = []
        for _ in range(args.steps):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return statistics.median(times)

    # Alternate the sides so that machine noise hits them alike; keep each one's best round.
    t_torch = dict.fromkeys(attn_impls, float("inf"))
    t_jax = float("inf")
    for _ in range(args.rounds):
        for attn in attn_impls:
            t_torch[attn] = min(t_torch[attn], timeit(lambda: torch_step(attn)))
        t_jax = min(t_jax, timeit(jax_step))
    print(
        f"config: hidden={args.hidden} layers={args.layers} heads={args.heads}/{args.kv_heads} head_dim={args.head_dim} "
        f"mlp={args.intermediate} vocab={args.vocab} batch={args.batch}x{args.seq} remat={args.remat} "
        f"compute={args.compute_dtype} threads={threads} clock={args.clock} jax={jax.__version__} torch={torch.__version__}"
    )
    print(f"loss ours {loss_jax:.6f} " + " ".join(f"torch ({a}) {v:.6f}" for a, v in losses.items()))
    print(f"mpa_jax (jit)           fwd+bwd: {tokens / t_jax:,.0f} tokens/s ({t_jax * 1e3:.0f} ms/step)")
    for attn, t in t_torch.items():
        print(f"transformers attn={attn:5s} fwd+bwd: {tokens / t:,.0f} tokens/s ({t * 1e3:.0f} ms/step)"
              f"   ratio ours/torch: {t / t_jax:.2f}x")
    if args.profile:
        print_op_profile(lambda: step(params))


def print_op_profile(fn, steps: int = 2) -> None:
    """Per-op time of `fn`'s XLA program, summed by fusion kind (name without its .N suffix)."""
    import collections
    import glob
    import gzip
    import json
    import re

    import jax

    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(steps):
                jax.block_until_ready(fn())
        (path,) = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
        events = json.load(gzip.open(path))["traceEvents"]
    by_kind: collections.Counter = collections.Counter()
    by_op: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("$", "ThunkExecutor", "end:", "Pjit", "Common", "Thread")):
            continue
        by_kind[re.sub(r"\.\d+$", "", name)] += e.get("dur", 0)
        by_op[name] += e.get("dur", 0)
    print(f"our step by XLA op kind (ms per step, total {sum(by_kind.values()) / steps / 1e3:.0f}):")
    for kind, us in by_kind.most_common(12):
        print(f"  {us / steps / 1e3:8.1f}  {kind}")
    print("  largest single ops: " + ", ".join(f"{n} {us / steps / 1e3:.0f}" for n, us in by_op.most_common(6)))


if __name__ == "__main__":
    main()
