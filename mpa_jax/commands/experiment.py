"""`mpa experiment care-vs-vanilla --config ... [--init DIR] [--seeds N]`: named experiments (see `mpa_jax.rl.experiment`)."""
from __future__ import annotations

import argparse
from typing import Any

EXPERIMENTS = ("care-vs-vanilla",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"the experiment: one of {', '.join(EXPERIMENTS)}")
    parser.add_argument("--init", default=None,
                        help="the SFT checkpoint both algorithms start from (HF dir or orbax run dir); "
                             "default: oracle demonstrations of config.rl.templates + SFT, made into <workdir>/sft")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per algorithm (config.seed, config.seed+1, ...)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError

    if args.name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {args.name!r}; known: {', '.join(EXPERIMENTS)}")
    from mpa_jax.rl.experiment import care_vs_vanilla, table
    from mpa_jax.train import CheckpointError

    try:
        summary = care_vs_vanilla(config, args.workdir, init=args.init, seeds=args.seeds)
    except (CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    print(table(summary))
    print(f"plot {summary['png']}   summary {args.workdir}/summary.json")
    return 0
