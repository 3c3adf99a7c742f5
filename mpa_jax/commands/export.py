"""`mpa export --checkpoint RUN_OR_STEP_DIR --out DIR`: orbax training checkpoint -> Hugging Face directory."""
from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir, its checkpoints/ dir, or one step dir (latest step by default)")
    parser.add_argument("--out", required=True, help="output directory for config.json, safetensors shards and tokenizer")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="tensor dtype written")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir to copy (default: config.tokenizer.path or <run>/tokenizer)")
    parser.add_argument("--max-shard-gb", type=float, default=2.0, help="size of a safetensors shard (GB)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError
    from mpa_jax.export import export_checkpoint
    from mpa_jax.train import CheckpointError

    tok = args.tokenizer
    if tok is None:
        run_dir = os.path.abspath(args.checkpoint)
        # walk up from a step dir / checkpoints dir to the run dir
        for _ in range(3):
            cand = [str(config.tokenizer.get("path", "") or ""), os.path.join(run_dir, "tokenizer")]
            tok = next((c for c in cand if c and os.path.isdir(c)), None)
            if tok:
                break
            run_dir = os.path.dirname(run_dir)
    elif not os.path.isdir(tok):
        raise UserError(f"tokenizer directory not found: {tok}")
    try:
        out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, tokenizer_dir=tok,
                                max_shard_bytes=int(args.max_shard_gb * 1024**3))
    except CheckpointError as e:
        raise UserError(str(e)) from None
    print(f"exported {args.checkpoint} -> {out}" + ("" if tok else " (no tokenizer found to copy)"))
    return 0
