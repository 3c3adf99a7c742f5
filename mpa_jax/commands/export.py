"""`mpa export --checkpoint RUN_OR_STEP_DIR --out DIR`: orbax training checkpoint -> Hugging Face directory.

The directory gets the run's tokenizer (its `tokenizer/`, else the one its card or saved config names) and
the card `mpa_checkpoint.json` (context format, positions, recipe), so it is a start for every command.
"""
from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "example: mpa export --checkpoint runs/my_sft --out runs/my_sft_hf"
    parser.add_argument("--checkpoint", required=True, metavar="RUN",
                        help="run dir, its checkpoints/ dir, or one step dir (latest step by default)")
    parser.add_argument("--out", required=True, help="output directory for config.json, safetensors shards and tokenizer")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="tensor dtype written")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir to copy (default: the run's own: <run>/tokenizer, else the one its card or saved config names)")
    parser.add_argument("--max-shard-gb", type=float, default=2.0, help="size of a safetensors shard (GB)")
    from mpa_jax.cli import add_distributed_arguments

    add_distributed_arguments(parser, "jax.distributed.initialize() first (run the same command on every host; process 0 writes)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import init_distributed
    from mpa_jax.errors import UserError

    init_distributed(args)
    from mpa_jax.export import export_checkpoint
    from mpa_jax.train import CheckpointError

    from mpa_jax.start import StartError, resolve_start

    try:
        start = resolve_start(args.checkpoint)
    except StartError as e:
        raise UserError(str(e)) from None
    if start.kind == "hf":
        raise UserError(f"--checkpoint {args.checkpoint} is already a Hugging Face directory (nothing to export)")
    tok = args.tokenizer or start.tokenizer_dir
    if args.tokenizer is not None and not os.path.isdir(args.tokenizer):
        raise UserError(f"tokenizer directory not found: {args.tokenizer}")
    try:
        out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, tokenizer_dir=tok,
                                max_shard_bytes=int(args.max_shard_gb * 1024**3))
    except CheckpointError as e:
        raise UserError(str(e)) from None
    print(f"exported {args.checkpoint} -> {out}" + ("" if tok else " (no tokenizer found to copy: pass --tokenizer DIR)"))
    return 0
