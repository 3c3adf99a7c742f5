"""`mpa serve --checkpoint DIR [--served-model-name NAME] [--api-key KEY] [--host H] [--port N]`: the
embedded engine behind HTTP (docs/serving.md).

No config is needed: `--checkpoint` is a start as every command names one (an HF directory, an orbax run
directory or `starter`; `mpa_jax.start`), and context length, tokenizer and context format (how tools are
shown, reasoning) come from it; the config's `serve` section gives the server's limits.

Serves the SGLang-native subset (`/generate`, `/update_weights_from_disk`, `/flush_cache`, `/health`,
`/health_generate`, `/model_info`, `/server_info`, `/get_load`: what sglang-router asks a worker) and OpenAI `POST /v1/chat/completions` (tools, streaming, n,
logprobs, stop, seed) and `/v1/completions`; see `mpa_jax.rollout.server.app`. The engine never samples
an id the tokenizer cannot decode. Binds 127.0.0.1 unless told otherwise. `--print-sglang` prints the
equivalent `python -m sglang.launch_server` command for the checkpoint instead of serving.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

API_KEY_ENV = "MPA_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("example: mpa serve --checkpoint starter --port 0   (then point an OpenAI client at the printed URL + /v1;"
                     " docs/serving.md)")
    from mpa_jax.cli import add_start_argument

    add_start_argument(parser, extra="; default: config.model.init_from, else the config's untrained model")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients name (default: the checkpoint's name, e.g. starter); requests naming another get 404")
    parser.add_argument("--api-key", default=None,
                        help=f"require `Authorization: Bearer KEY` on every route but /health (default: ${API_KEY_ENV}, else config.serve.api_key)")
    parser.add_argument("--host", default=None, help="address to bind (default: config.serve.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: config.serve.port; 0 = any free port)")
    parser.add_argument("--print-sglang", action="store_true", help="print the sglang.launch_server command for --checkpoint and exit")
    parser.add_argument("--tp", type=int, default=1, help="with --print-sglang: tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1, help="with --print-sglang: data-parallel size")
    parser.add_argument("--mem-fraction", type=float, default=0.85, help="with --print-sglang: --mem-fraction-static")
    parser.add_argument("--deterministic", action="store_true",
                        help="with --print-sglang: --enable-deterministic-inference (SGLang ignores per-request seeds without it)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError

    host = args.host or str(config.serve.host)
    port = int(config.serve.port) if args.port is None else args.port
    if not 0 <= port < 65536:
        raise UserError(f"--port must be in 0..65535, got {port}")
    # The CLI resolved --checkpoint (`mpa_jax.start`) and fitted the config to it: its HF directory is
    # config.model.init_from, its tokenizer config.tokenizer.path, its context format config.context.
    start = getattr(args, "start", None)
    ckpt = str(config.model.init_from) if start is not None else None
    if args.print_sglang:
        from mpa_jax.rollout.launch import format_command, sglang_launch_command

        if ckpt is None:
            raise UserError("--print-sglang needs --checkpoint (an HF directory, a run directory or starter)")
        try:
            cmd = sglang_launch_command(ckpt, host=host, port=port or 30000, tp=args.tp, dp=args.dp,
                                        mem_fraction=args.mem_fraction, deterministic=args.deterministic)
        except ValueError as e:
            raise UserError(str(e)) from None
        print(format_command(cmd))
        return 0

    from mpa_jax.rollout.engines import RolloutSetupError, load_rollout_tokenizer, make_engine
    from mpa_jax.rollout.server import create_app, serve_forever
    from mpa_jax.rollout.server.guard import Limits

    if str(config.rollout.engine) != "jax":
        raise UserError("mpa serve runs the embedded engine: set --config.rollout.engine=jax")
    from mpa_jax.envs.context import ContextFormat

    try:
        limits = Limits.from_config(config.serve)
        context = ContextFormat.from_config(config)
    except ValueError as e:
        raise UserError(str(e)) from None
    source = "the checkpoint's card" if start is not None and start.context else "config.context"
    api_key = resolve_api_key(args.api_key, config.serve)
    name = args.served_model_name or (start.name if start is not None else str(config.name))
    if not name.strip():
        raise UserError("--served-model-name must not be empty")
    try:
        tokenizer = load_rollout_tokenizer(config, ckpt, args.workdir)
        # The engine never samples an id the tokenizer cannot decode (padded embedding rows).
        engine = make_engine(config, ckpt, tokenizer=tokenizer)
    except RolloutSetupError as e:
        raise UserError(str(e)) from None
    from mpa_jax import tokenizer as tk

    # Where the tokenizer came from, for `/server_info` (sglang-router registers it with the worker).
    tok_dir = ckpt if ckpt and tk.is_tokenizer_dir(ckpt) else None
    app = create_app(
        engine,
        tokenizer,
        model_path=os.path.abspath(ckpt) if ckpt else "",
        tokenizer_path=os.path.abspath(tok_dir) if tok_dir else str(config.tokenizer.path),
        served_model_name=name,
        max_batch=int(config.serve.max_batch),
        default_max_new_tokens=int(config.serve.max_new_tokens),
        batcher=str(config.serve.batcher),
        slot_len=int(config.serve.slot_len),
        slot_chunk=int(config.serve.slot_chunk),
        context=context,
        api_key=api_key,
        limits=limits,
    )
    warning = bind_warning(host, api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    positions = getattr(getattr(engine, "cfg", None), "max_position_embeddings", "?")

    def started(url: str) -> None:
        print(f"mpa serve: {url} model {name!r} (weights {engine.weight_version}, context {positions} tokens,"
              f" tools {context.format}, reasoning {context.reasoning} from {source}; auth {'on' if api_key else 'off'})",
              flush=True)

    try:
        serve_forever(app, host, port, on_start=started)
    except OSError as e:
        raise UserError(str(e)) from None
    return 0


def resolve_api_key(flag: str | None, serve: Any) -> str:
    """--api-key, else $MPA_API_KEY, else config.serve.api_key ("" = no key)."""
    if flag is not None:
        return flag
    return os.environ.get(API_KEY_ENV) or str(serve.api_key)


def bind_warning(host: str, api_key: str) -> str | None:
    """The warning for a server anyone on the network can use (a non-loopback address, no API key)."""
    if api_key or is_loopback(host):
        return None
    return (f"mpa serve: warning: binding {host} (not loopback) without an API key: anyone who can reach this port"
            f" can use the model; set --api-key or ${API_KEY_ENV}")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
