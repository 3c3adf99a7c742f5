"""`mpa rl --config configs/... [--init HF_DIR_OR_CHECKPOINT]`: online CARE / vanilla RL (see `mpa_jax.rl`)."""
from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--init", default=None,
                        help="start from this Hugging Face directory or orbax run/checkpoint dir (e.g. an SFT run); "
                             "default: config.model.init_from, else random weights")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many RL steps (resumable)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError
    from mpa_jax.rl.trainer import RLDiverged, run_rl
    from mpa_jax.train import CheckpointError

    try:
        result = run_rl(config, args.workdir, init=args.init, max_steps=args.max_steps)
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
