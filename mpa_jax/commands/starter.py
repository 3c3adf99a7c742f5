"""`mpa starter --config configs/starter.py --out starter`: build the starter planner (see `mpa_jax.sft.starter`)."""
from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = 'example: mpa starter --config starter --workdir runs/starter --out starter'
    parser.add_argument("--out", default="starter", help="directory to write the starter into (default: starter)")
    parser.add_argument("--data", default=None, help="oracle trajectories to train on (default: made into the run directory)")
    parser.add_argument("--eval-seen", type=int, default=96, help="final evaluation: dev tasks of templates seen in training")
    parser.add_argument("--eval-held-out", type=int, default=48, help="final evaluation: dev tasks of held-out templates")
    parser.add_argument("--curve-seen", type=int, default=32, help="dev tasks (seen templates) at every SFT eval point")
    parser.add_argument("--note", default="", help="a line for the datasheet (e.g. how an interrupted build was resumed)")
    parser.add_argument("--curve-held-out", type=int, default=16, help="dev tasks (held-out templates) at every SFT eval point")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError
    from mpa_jax.sft import DataError
    from mpa_jax.sft.starter import build_starter
    from mpa_jax.train import CheckpointError

    from mpa_jax.card import stamp_run_dir

    try:
        # the run's card first: the export (and so the starter directory) carries its recipe and context format
        stamp_run_dir(args.workdir, config, stage="starter", command=getattr(args, "command_line", None),
                      config_file=getattr(args, "config_file", None))
        sheet = build_starter(config, args.workdir, args.out, eval_seen=args.eval_seen, eval_held_out=args.eval_held_out,
                              curve_seen=args.curve_seen, curve_held_out=args.curve_held_out, data=args.data, note=args.note)
    except (DataError, CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    fe = sheet["final_eval"]
    print(f"starter -> {args.out}: {sheet['train']['steps']} steps; greedy dev success {100 * fe['success']:.1f}%"
          f" (seen templates {100 * fe.get('success_seen', 0):.1f}%, held-out templates {100 * fe.get('success_held_out', 0):.1f}%)")
    return 0
