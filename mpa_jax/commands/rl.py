"""`mpa rl [--config NAME] --checkpoint PATH|starter [--max-steps N]`: online CARE / vanilla RL (see `mpa_jax.rl`).

`--checkpoint` is the start: an HF directory, an SFT/RL run directory (exported once to an HF directory
in the workdir) or `starter`; the run uses its tokenizer, context format and shape. Without it:
`config.model.init_from`, else the config's model with random weights. `--init` is the old spelling.
The run directory carries its tokenizer and card, so it is a start for the next command.
"""
from __future__ import annotations

import argparse
from typing import Any

EXAMPLE = ("example: mpa sft --checkpoint starter --max-steps 30 --workdir runs/sft && "
           "mpa rl --checkpoint runs/sft --max-steps 2 --workdir runs/rl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mpa_jax.cli import add_start_argument

    parser.epilog = EXAMPLE
    add_start_argument(parser, extra="; default: config.model.init_from, else random weights")
    parser.add_argument("--init", dest="checkpoint", help=argparse.SUPPRESS)  # the old spelling of --checkpoint
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many RL steps (resumable)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError
    from mpa_jax.rl.trainer import RLDiverged, run_rl
    from mpa_jax.card import stamp_run_dir
    from mpa_jax.train import CheckpointError

    try:
        # the start is in the fitted config (model.init_from = its HF directory, tokenizer.path = its tokenizer)
        recipe = dict(stage="rl", command=getattr(args, "command_line", None), config_file=getattr(args, "config_file", None),
                      start=args.start.path if getattr(args, "start", None) else None)
        stamp_run_dir(args.workdir, config, **recipe)
        result = run_rl(config, args.workdir, init=None, max_steps=args.max_steps)
        stamp_run_dir(args.workdir, config, **recipe)  # again: a from-scratch run built its tokenizer meanwhile
    except (CheckpointError, ValueError) as e:  # bad config key value, checkpoint or init dir: one line
        raise UserError(str(e)) from None
    except RLDiverged as e:
        print(f"mpa rl: stopped: {e}")
        return 1
    if result.interrupted:  # SIGINT/SIGTERM: saved at the step boundary
        print(result.interrupted)
        return 130
    last = result.history[-1] if result.history else {}
    print(f"rl steps {result.steps}" + (f" (resumed from {result.resumed_from})" if result.resumed_from is not None else "")
          + f"  weight version {result.weight_version}"
          + (f"  last success {last.get('rl/success', float('nan')):.3f}" if last else ""))
    print(f"checkpoints {result.checkpoint_dir}   metrics {result.metrics_path}")
    return 0
