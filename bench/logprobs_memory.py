"""Peak memory of chunked vs naive log-probs (forward + backward) at T=4,096 for Qwen vocabularies.

For each vocabulary size, compiles value-and-grad of (sum logp + sum entropy) with respect to hidden
and unembedding, for `chunked_logprobs` and for the naive full-logits computation, and prints XLA's
buffer-assignment figures on CPU: peak temporary bytes and temp + arguments + outputs. Nothing large
is allocated unless --run is given, which also executes each program once in a fresh subprocess and
reports the process's peak resident memory.

    .venv/bin/python bench/logprobs_memory.py [--tokens 4096 --hidden 2048 --chunk 8192 --run]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

VOCABS = (151_936, 248_320)


DTYPE = "bfloat16"


def _program(kind: str, tokens: int, hidden: int, vocab: int, chunk: int):
    import jax
    import jax.numpy as jnp

    from mpa_jax.kernels.logprobs import chunked_logprobs, naive_logprobs

    def loss(h, w, y):
        if kind == "chunked":
            logp, ent = chunked_logprobs(h, w, y, chunk_size=chunk)
        else:
            logp, ent = naive_logprobs(h, w, y)
        return jnp.sum(logp) + jnp.sum(ent)

    dt = jnp.dtype(DTYPE)
    args = (
        jax.ShapeDtypeStruct((1, tokens, hidden), dt),
        jax.ShapeDtypeStruct((hidden, vocab), dt),
        jax.ShapeDtypeStruct((1, tokens), jnp.int32),
    )
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), args


def analyse(kind: str, tokens: int, hidden: int, vocab: int, chunk: int) -> dict[str, int]:
    """XLA's memory figures for the compiled fwd+bwd program."""
    fn, args = _program(kind, tokens, hidden, vocab, chunk)
    m = fn.lower(*args).compile().memory_analysis()
    return {
        "temp": int(m.temp_size_in_bytes),
        "total": int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes),
    }


def run_once(kind: str, tokens: int, hidden: int, vocab: int, chunk: int) -> int:
    """Execute once in this process; return peak RSS bytes."""
    import resource

    import jax
    import jax.numpy as jnp

    fn, args = _program(kind, tokens, hidden, vocab, chunk)
    h = jax.random.normal(jax.random.key(0), args[0].shape, args[0].dtype)
    w = (jax.random.normal(jax.random.key(1), args[1].shape, jnp.float32) * 0.02).astype(args[1].dtype)
    y = jax.random.randint(jax.random.key(2), args[2].shape, 0, vocab)
    jax.block_until_ready(fn(h, w, y))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--run", action="store_true", help="also execute and report peak RSS (slow, needs RAM)")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DTYPE
    DTYPE = args.dtype
    if args._child:
        kind, vocab = args._child[0], int(args._child[1])
        print(json.dumps({"rss": run_once(kind, args.tokens, args.hidden, vocab, args.chunk)}))
        return
    gib = 1024**3
    print(f"fwd+bwd of logp+entropy, {args.dtype} hidden [1, {args.tokens}, {args.hidden}] and unembedding; chunk={args.chunk}")
    print("[T, V] float32 logits alone would be: " + ", ".join(f"V={v:,}: {args.tokens * v * 4 / gib:.2f} GiB" for v in VOCABS))
    for vocab in VOCABS:
        res = {kind: analyse(kind, args.tokens, args.hidden, vocab, args.chunk) for kind in ("naive", "chunked")}
        line = (
            f"V={vocab:,}: naive temp {res['naive']['temp'] / gib:.2f} GiB (total {res['naive']['total'] / gib:.2f}); "
            f"chunked temp {res['chunked']['temp'] / gib:.2f} GiB (total {res['chunked']['total'] / gib:.2f}); "
            f"temp ratio {res['naive']['temp'] / res['chunked']['temp']:.1f}x, "
            f"total ratio {res['naive']['total'] / res['chunked']['total']:.1f}x"
        )
        print(line, flush=True)
        if args.run:
            rss = {}
            for kind in ("naive", "chunked"):
                out = subprocess.run(
                    [sys.executable, __file__, "--tokens", str(args.tokens), "--hidden", str(args.hidden),
                     "--chunk", str(args.chunk), "--dtype", args.dtype, "--_child", kind, str(vocab)],
                    check=True, capture_output=True, text=True,
                )
                rss[kind] = json.loads(out.stdout.strip().splitlines()[-1])["rss"]
            print(
                f"  measured peak RSS: naive {rss['naive'] / gib:.2f} GiB, chunked {rss['chunked'] / gib:.2f} GiB, "
                f"ratio {rss['naive'] / rss['chunked']:.1f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
