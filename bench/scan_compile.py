"""Compile time of forward+backward, unrolled vs scanned layers, at two depths (narrow width, CPU).

    python bench/scan_compile.py [--depths 8 64] [--family qwen3|qwen3_5] [--repeats 1]

Prints one row per (layout, depth): trace+lower seconds, XLA compile seconds, and the ratio of the
deep to the shallow compile. Target (docs/perf.md): scanned 64 layers compile in < 1.5x the time of 8.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from mpa_jax import models


def _cfg(family: str, depth: int, scanned: bool) -> models.ModelConfig:
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=depth, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, remat="full", scan_layers=scanned)
    if family == "qwen3_5":
        common.update(family="qwen3_5", partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4,
                      linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=4)
    return models.ModelConfig(**common)


def compile_seconds(cfg: models.ModelConfig, batch: int = 2, length: int = 64) -> tuple[float, float]:
    """(trace + lower, compile) seconds of jit(grad(loss)) for `cfg`, from abstract inputs only."""
    shapes = cfg.abstract_params()
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)

    def loss(p, i):
        return jnp.mean(jnp.square(models.hidden_states(cfg, p, i).astype(jnp.float32)))

    t0 = time.perf_counter()
    lowered = jax.jit(jax.grad(loss)).lower(shapes, ids)
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--depths", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--family", default="qwen3", choices=["qwen3", "qwen3_5"])
    ap.add_argument("--layouts", nargs="+", default=["scanned", "unrolled"])
    args = ap.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; family {args.family}; fwd+bwd, remat=full")
    print("| layout | depth | trace+lower s | compile s | total s | total vs depth " + str(args.depths[0]) + " |")
    print("|---|---|---|---|---|---|")
    for layout in args.layouts:
        base = None
        for depth in args.depths:
            lower, comp = compile_seconds(_cfg(args.family, depth, layout == "scanned"))
            total = lower + comp
            base = base or total
            print(f"| {layout} | {depth} | {lower:.2f} | {comp:.2f} | {total:.2f} | {total / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
