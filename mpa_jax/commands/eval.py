"""`mpa eval --config F --checkpoint DIR [--split test] [--harness on|off|both] [--k N]`: the benchmark.

Writes `<out>/eval.json` (default out: `<workdir>/eval/<checkpoint name>`): Overall, per category and per
domain success, partial score, pass@1, pass^k, mean output tokens, tool calls and cost per 1,000 tasks
(input tokens, output tokens, tool calls and device seconds priced separately by `config.eval.prices`, and
the output-tokens-only figure). Sandbox tasks only.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from mpa_jax.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="exported Hugging Face directory, or 'untrained' for the config's random model")
    parser.add_argument("--split", default=None, help="held-out split (default: config.eval.split)")
    parser.add_argument("--harness", default="off", help="on | off | both (both: the same checkpoint with and without the harness)")
    parser.add_argument("--k", type=int, default=None, help="runs per task (default: config.eval.k; 1 = one greedy run)")
    parser.add_argument("--max-tasks", type=int, default=None, help="tasks (stratified; default: config.eval.max_tasks; 0 = all)")
    parser.add_argument("--out", default=None, help="output directory for eval.json and the rollouts")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.eval import HarnessUnavailable, evaluate
    from mpa_jax.eval.run import HARNESS_MODES, format_eval
    from mpa_jax.rollout.run import RolloutSetupError

    if args.harness not in HARNESS_MODES:
        raise UserError(f"--harness must be one of {', '.join(HARNESS_MODES)}, got {args.harness!r}")
    if args.k is not None and args.k < 1:
        raise UserError(f"--k must be >= 1, got {args.k}")
    ckpt = None if args.checkpoint == "untrained" else args.checkpoint
    if ckpt is not None and not os.path.isdir(ckpt):
        raise UserError(f"--checkpoint {ckpt}: no such directory")
    name = "untrained" if ckpt is None else os.path.basename(os.path.normpath(ckpt))
    out = args.out or os.path.join(args.workdir, "eval", name)
    try:
        report = evaluate(config, ckpt, out_dir=out, split=args.split, harness=args.harness, k=args.k,
                          max_tasks=args.max_tasks, workdir=args.workdir)
    except (HarnessUnavailable, RolloutSetupError) as e:
        raise UserError(str(e)) from None
    except ValueError as e:
        raise UserError(str(e)) from None
    print(format_eval(report))
    print(f"wrote {os.path.join(out, 'eval.json')}")
    return 0
