"""`mpa loop --config configs/NAME.py [--workdir D]`: the closed loop (see mpa_jax/loop.py).

Run it again after an interruption and it continues; `--fresh` starts over. Ends by printing the
headline table (held-out success of every stage) and where `summary.json` and `report.html` are.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from mpa_jax.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh", action="store_true", help="delete the run directory's earlier loop outputs first")
    parser.add_argument("--rounds", type=int, default=None, help="rounds after the cold start (default: config.loop.rounds)")
    from mpa_jax.cli import add_start_argument

    parser.epilog = "example: mpa loop --config micro --checkpoint starter --rounds 1 --workdir runs/loop"
    add_start_argument(parser, extra="; default: --starter / config.loop.starter")
    parser.add_argument("--starter", default=None,
                        help="starter planner directory to start from (default: config.loop.starter when set; '' = from scratch);"
                             " --checkpoint PATH names any start")


def use_starter(config: Any, starter_arg: str | None) -> tuple[Any, str | None]:
    """(config pointed at the starter planner, its directory) when one is named (`--starter`, else
    `config.loop.starter`) and present; (config, None) to train from scratch."""
    from mpa_jax.sft.starter import StarterError, find_starter, load_starter, with_starter

    explicit = starter_arg is not None
    if starter_arg is None:
        starter_arg = str(config.loop.starter)
    path = find_starter(starter_arg) if starter_arg else None
    if starter_arg and path is None:
        if explicit:
            raise UserError(f"--starter {starter_arg}: no config.json there")
        return config, None  # the config's default starter is not built here: from scratch, as the demo does
    if path is None:
        return config, None
    try:
        return with_starter(config, load_starter(path)), path
    except StarterError as e:
        raise UserError(str(e)) from None


def run(args: argparse.Namespace, config: Any) -> int:
    from rich.console import Console

    from mpa_jax.loop import STATE_FILE, run_loop
    from mpa_jax.report import format_headline
    from mpa_jax.rl.trainer import RLSetupError
    from mpa_jax.rollout.engines import RolloutSetupError

    if args.rounds is not None:
        if args.rounds < 0:
            raise UserError(f"--rounds must be >= 0, got {args.rounds}")
        config.loop.rounds = args.rounds
    if args.fresh:
        for sub in (STATE_FILE, "data", "eval", "sft", "final", "harness", "summary.json", "report.html",
                    *(f"r{r}" for r in range(1, 100))):
            p = os.path.join(args.workdir, sub)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)
    console = Console()
    if args.start is not None:  # the CLI fitted the config to it (model.init_from, tokenizer, context format)
        if args.starter is not None:
            raise UserError("give the start once: --checkpoint or --starter")
        console.print(f"starting from the checkpoint {args.start.path}")
    else:
        config, starter = use_starter(config, args.starter)
        console.print(f"starting from the starter planner {starter}" if starter else "starting from scratch (no starter planner)")
        if starter:  # fitted to the starter after the CLI saved it: the saved config is what runs
            from mpa_jax.config import save_config

            save_config(config, args.workdir)
    from mpa_jax.sft.data import DataError

    try:
        summary = run_loop(config, args.workdir, console=console)
    except (RolloutSetupError, DataError, RLSetupError) as e:  # a config that does not fit (data, model, RL settings): one line, the run dir kept for resume
        raise UserError(str(e)) from None
    console.rule("[bold]headline")
    console.print(format_headline(summary), highlight=False, soft_wrap=True)  # a table: never re-wrapped
    console.print(f"summary: {os.path.join(args.workdir, 'summary.json')}")
    console.print(f"report:  {summary['report']}")
    return 0
