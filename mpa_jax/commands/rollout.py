"""`mpa rollout [--config NAME] [--checkpoint PATH|starter] [--split dev] [--out FILE]`: episodes over a task split.

Writes one Trajectory per task (JSONL) and `<FILE without .jsonl>.summary.json` (the metrics of
`mpa_jax.eval.metrics`: success overall, by template group, category and domain, costs); prints them.
`--checkpoint` is a start as every command names one (an HF directory, a run directory or `starter`; its
own tokenizer, context format and positions). Without it (and without config.model.init_from) the config's
model runs with random weights (the untrained baseline).
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from mpa_jax.envs.contract import SPLITS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mpa_jax.cli import add_env_arguments, add_start_argument

    parser.epilog = "example: mpa rollout --checkpoint starter --split dev --max-tasks 8"
    add_start_argument(parser, extra="; default: config.model.init_from, else the untrained model")
    parser.add_argument("--split", default=None, help="task split (train|dev|test) or a task JSONL path (default: config.rollout.split)")
    parser.add_argument("--out", default=None, help="trajectory JSONL to write (default: <workdir>/rollouts-<split>.jsonl)")
    parser.add_argument("--max-tasks", type=int, default=None, help="first N tasks of the split (default: config.rollout.max_tasks; 0 = all)")
    parser.add_argument("--sample", action="store_true", help="sample at config.rollout.temperature instead of greedy evaluation")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: config.seed)")
    add_env_arguments(parser)


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import apply_env_arguments
    from mpa_jax.errors import UserError
    from mpa_jax.envs import load_tasks
    from mpa_jax.eval import Evaluator, eval_metrics, format_eval
    from mpa_jax.rollout.engines import RolloutSetupError

    apply_env_arguments(args, config)
    split = args.split or str(config.rollout.split)
    if split not in SPLITS and not os.path.isfile(split):
        raise UserError(f"--split {split!r} is neither one of {', '.join(SPLITS)} nor a task JSONL file")
    ckpt = str(config.model.init_from) if args.start is not None else None  # the start's HF directory
    if args.max_tasks is not None and args.max_tasks < 0:
        raise UserError(f"--max-tasks must be >= 0, got {args.max_tasks}")
    n = int(config.rollout.max_tasks if args.max_tasks is None else args.max_tasks)
    tasks = load_tasks(split)
    tasks = tasks[:n] if n > 0 else tasks
    if not tasks:
        raise UserError(f"--split {split!r} has no tasks")
    name = os.path.splitext(os.path.basename(split))[0]
    out = args.out or os.path.join(args.workdir, f"rollouts-{name}.jsonl")
    label = args.start.name if args.start is not None else "untrained"
    greedy = bool(config.rollout.greedy_eval) and not args.sample
    try:
        ev = Evaluator(config, tasks)
        engine = ev.engine_for(ckpt, args.workdir)
        for p in (out, out[:-6] + ".summary.json" if out.endswith(".jsonl") else out + ".summary.json"):
            if os.path.exists(p):  # a rollout command always runs again (an eval reuses complete runs)
                os.remove(p)
        trajs = ev.run(engine, out, greedy=greedy, seed=args.seed, label=label)
    except RolloutSetupError as e:
        raise UserError(str(e)) from None
    metrics = eval_metrics(trajs, prices=ev.prices)
    print(format_eval({"k": 1, "tasks": len(tasks), "split": split, "harness": {"on" if config.harness.enabled else "off": metrics}}))
    print(f"trajectories: {out}")
    return 0
