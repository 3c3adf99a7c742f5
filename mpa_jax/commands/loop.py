"""`mpa loop --config configs/NAME.py [--workdir D]`: the closed loop (see mpa_jax/loop.py).

Run it again after an interruption and it continues; `--fresh` starts over. Ends by printing the
headline table (held-out success of every stage) and where `summary.json` and `report.html` are.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from mpa_jax.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh", action="store_true", help="delete the run directory's earlier loop outputs first")
    parser.add_argument("--rounds", type=int, default=None, help="rounds after the cold start (default: config.loop.rounds)")


def run(args: argparse.Namespace, config: Any) -> int:
    from rich.console import Console

    from mpa_jax.loop import STATE_FILE, format_headline, run_loop
    from mpa_jax.rollout.run import RolloutSetupError

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
    try:
        summary = run_loop(config, args.workdir, console=console)
    except RolloutSetupError as e:
        raise UserError(str(e)) from None
    console.rule("[bold]headline")
    console.print(format_headline(summary), highlight=False)
    console.print(f"summary: {os.path.join(args.workdir, 'summary.json')}")
    console.print(f"report:  {summary['report']}")
    return 0
