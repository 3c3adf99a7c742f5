"""`mpa rollout --config ... [--checkpoint DIR] [--split dev] [--out FILE]`: the agent loop over a task split.

Writes one Trajectory per task (JSONL) and `<FILE without .jsonl>.summary.json` with success overall,
by domain and by category; prints the summary. Without --checkpoint the config's model runs with
random weights (the untrained baseline).
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from mpa_jax.commands.oracle import add_env_arguments, apply_env_arguments
from mpa_jax.envs.contract import SPLITS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, help="exported Hugging Face checkpoint directory (default: untrained model)")
    parser.add_argument("--split", default=None, help="task split (train|dev|test) or a task JSONL path (default: config.rollout.split)")
    parser.add_argument("--out", default=None, help="trajectory JSONL to write (default: <workdir>/rollouts-<split>.jsonl)")
    parser.add_argument("--max-tasks", type=int, default=None, help="first N tasks of the split (default: config.rollout.max_tasks; 0 = all)")
    parser.add_argument("--sample", action="store_true", help="sample at config.rollout.temperature instead of greedy evaluation")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: config.seed)")
    add_env_arguments(parser)


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError
    from mpa_jax.rollout.run import RolloutSetupError, format_summary, run_rollouts

    if apply_env_arguments(args, config) == "adb":
        config.rollout.batch_size = 1  # one device holds one episode at a time
    split = args.split or str(config.rollout.split)
    if split not in SPLITS and not os.path.isfile(split):
        raise UserError(f"--split {split!r} is neither one of {', '.join(SPLITS)} nor a task JSONL file")
    if args.checkpoint is not None and not os.path.isdir(args.checkpoint):
        raise UserError(f"--checkpoint {args.checkpoint} is not a directory")
    if args.max_tasks is not None and args.max_tasks < 0:
        raise UserError(f"--max-tasks must be >= 0, got {args.max_tasks}")
    name = os.path.splitext(os.path.basename(split))[0]
    out = args.out or os.path.join(args.workdir, f"rollouts-{name}.jsonl")
    try:
        summary = run_rollouts(
            config,
            args.checkpoint,
            out_path=out,
            workdir=args.workdir,
            split=split,
            max_tasks=args.max_tasks,
            greedy=False if args.sample else None,
            seed=args.seed,
            label=os.path.basename(os.path.normpath(args.checkpoint)) if args.checkpoint else "untrained",
        )
    except RolloutSetupError as e:
        raise UserError(str(e)) from None
    print(format_summary(summary))
    print(f"trajectories: {summary['out_path']}\nsummary: {summary['summary_path']}")
    return 0
