"""`mpa serve --config ... --checkpoint DIR [--host H] [--port N]`: the embedded engine behind HTTP.

Serves the SGLang-native subset (`/generate`, `/update_weights_from_disk`, `/flush_cache`, `/health`,
`/health_generate`, `/model_info`, `/server_info`, `/get_load`: what sglang-router asks a worker) and OpenAI `POST /v1/chat/completions` (tools, streaming, n,
logprobs, stop, seed) and `/v1/completions`; see `mpa_jax.rollout.server.app`. The engine never samples
an id the tokenizer cannot decode. Binds 127.0.0.1 unless told otherwise. `--print-sglang` prints the
equivalent `python -m sglang.launch_server` command for the checkpoint instead of serving.
"""
from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, help="exported Hugging Face checkpoint directory (default: untrained model)")
    parser.add_argument("--host", default=None, help="address to bind (default: config.serve.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: config.serve.port; 0 = any free port)")
    parser.add_argument("--print-sglang", action="store_true", help="print the sglang.launch_server command for --checkpoint and exit")
    parser.add_argument("--tp", type=int, default=1, help="with --print-sglang: tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1, help="with --print-sglang: data-parallel size")
    parser.add_argument("--mem-fraction", type=float, default=0.85, help="with --print-sglang: --mem-fraction-static")
    parser.add_argument("--deterministic", action="store_true",
                        help="with --print-sglang: --enable-deterministic-inference (SGLang ignores per-request seeds without it)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError

    host = args.host or str(config.serve.host)
    port = int(config.serve.port) if args.port is None else args.port
    if not 0 <= port < 65536:
        raise UserError(f"--port must be in 0..65535, got {port}")
    if args.checkpoint is not None and not os.path.isdir(args.checkpoint):
        raise UserError(f"--checkpoint {args.checkpoint} is not a directory")
    if args.print_sglang:
        from mpa_jax.rollout.launch import format_command, sglang_launch_command

        if args.checkpoint is None:
            raise UserError("--print-sglang needs --checkpoint (an exported HF directory)")
        try:
            cmd = sglang_launch_command(args.checkpoint, host=host, port=port or 30000, tp=args.tp, dp=args.dp,
                                        mem_fraction=args.mem_fraction, deterministic=args.deterministic)
        except ValueError as e:
            raise UserError(str(e)) from None
        print(format_command(cmd))
        return 0

    from mpa_jax.rollout.engines import RolloutSetupError, load_rollout_tokenizer, make_engine
    from mpa_jax.rollout.server import create_app, serve_forever

    if str(config.rollout.engine) != "jax":
        raise UserError("mpa serve runs the embedded engine: set --config.rollout.engine=jax")
    if str(config.serve.get("batcher", "auto")) not in ("auto", "slots", "call"):
        raise UserError(f"config.serve.batcher must be auto, slots or call, got {config.serve.batcher!r}")
    try:
        tokenizer = load_rollout_tokenizer(config, args.checkpoint, args.workdir)
        # The engine never samples an id the tokenizer cannot decode (padded embedding rows).
        engine = make_engine(config, args.checkpoint, tokenizer=tokenizer)
    except RolloutSetupError as e:
        raise UserError(str(e)) from None
    from mpa_jax import tokenizer as tk

    # Where the tokenizer came from, for `/server_info` (sglang-router registers it with the worker).
    tok_dir = args.checkpoint if args.checkpoint and tk.is_tokenizer_dir(args.checkpoint) else None
    app = create_app(
        engine,
        tokenizer,
        model_path=os.path.abspath(args.checkpoint) if args.checkpoint else "",
        tokenizer_path=os.path.abspath(tok_dir) if tok_dir else str(config.tokenizer.get("path", "") or ""),
        served_model_name=str(config.get("name", "mpa")),
        max_batch=int(config.serve.max_batch),
        default_max_new_tokens=int(config.serve.max_new_tokens),
        batcher=str(config.serve.get("batcher", "auto")),
        slot_len=int(config.serve.get("slot_len", 1024)),
        slot_chunk=int(config.serve.get("slot_chunk", 8)),
    )
    serve_forever(app, host, port, on_start=lambda url: print(f"mpa serve: {url} (weights {engine.weight_version})", flush=True))
    return 0
