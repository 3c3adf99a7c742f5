"""`mpa export --checkpoint RUN_OR_STEP_DIR --out DIR`: orbax training checkpoint -> Hugging Face directory."""
from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir, its checkpoints/ dir, or one step dir (latest step by default)")
    parser.add_argument("--out", required=True, help="output directory for config.json, safetensors shards and tokenizer")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="tensor dtype written")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir to copy (default: config.tokenizer.path, the config.model.init_from checkpoint's, or <run>/tokenizer)")
    parser.add_argument("--max-shard-gb", type=float, default=2.0, help="size of a safetensors shard (GB)")
    parser.add_argument("--distributed", action="store_true",
                        help="multi-host: jax.distributed.initialize() first (run the same command on every host; process 0 writes)")
    parser.add_argument("--coordinator", default=None, help="host:port of process 0 (with --distributed)")
    parser.add_argument("--num-processes", type=int, default=None, help="number of processes (with --distributed)")
    parser.add_argument("--process-id", type=int, default=None, help="this process' index (with --distributed)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError
    from mpa_jax.commands.sft import init_distributed

    init_distributed(args)
    from mpa_jax.export import export_checkpoint
    from mpa_jax.train import CheckpointError

    tok = args.tokenizer
    if tok is None:
        from mpa_jax.tokenizer import TokenizerError, tokenizer_dir_for_config

        run_dir = os.path.abspath(args.checkpoint)
        # the run's tokenizer (tokenizer.path, the init_from checkpoint's, or <run>/tokenizer): walk up
        # from a step dir / checkpoints dir to the run dir
        for _ in range(3):
            try:
                tok = tokenizer_dir_for_config(config, run_dir)
            except TokenizerError as e:
                raise UserError(str(e)) from None
            if tok and os.path.isdir(tok):
                break
            tok = None
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
