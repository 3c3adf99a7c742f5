"""`mpa eval --checkpoint PATH|starter|untrained [--config NAME] [--split test] [--harness on|off|both] [--k N]`: the benchmark.

`--checkpoint` is a start as every command names one (an HF directory, a run directory or `starter`;
its own tokenizer, context format and positions), or `untrained` for the config's random model.

Writes `<out>/eval.json` (default out: `<workdir>/eval/<checkpoint name>`): Overall, per template group,
per category and per domain success, partial score, pass@1, pass^k, mean output tokens, tool calls and cost
per 1,000 tasks (input tokens, output tokens, tool calls and device seconds priced separately by
`config.eval.prices`, and the output-tokens-only figure). Sandbox tasks, or with `--env bfcl|agentdojo` that
external benchmark's split, scored by its own checker, per its categories (docs/benchmark.md).

`--split preregistered`: the pre-registered test set (600 test tasks, docs/preregistered.md; `--max-tasks 0` all
of it, `--seen 32 --held-out 16` the demo's 48). Tasks: `--max-tasks N` stratified tasks of the split, or `--seen N --held-out M` (N of templates seen in
training, M of held-out templates). `--samples N` adds N sampled runs per task and prints greedy success
with the unbiased pass@k for `--pass-k` at each `--temperature` (a markdown table; `passk.json`).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from mpa_jax.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mpa_jax.cli import add_start_argument

    parser.epilog = "example: mpa eval --checkpoint starter --max-tasks 20"
    add_start_argument(parser, required=True, extra="; or 'untrained' for the config's random model")
    parser.add_argument("--split", default=None, help="held-out split, or 'preregistered': the pre-registered test set "
                        "(docs/preregistered.md; default: config.eval.split)")
    parser.add_argument("--harness", default="off", help="on | off | both (both: the same checkpoint with and without the harness)")
    parser.add_argument("--k", type=int, default=None, help="runs per task (default: config.eval.k; 1 = one greedy run)")
    parser.add_argument("--max-tasks", type=int, default=None, help="tasks (stratified; default: config.eval.max_tasks; 0 = all)")
    parser.add_argument("--seen", type=int, default=0, help="tasks of templates seen in training (with --held-out; replaces --max-tasks)")
    parser.add_argument("--held-out", type=int, default=0, help="tasks of held-out templates (with --seen)")
    parser.add_argument("--samples", type=int, default=0, help="sampled runs per task: greedy success and pass@k (passk.json)")
    parser.add_argument("--pass-k", type=int, nargs="+", default=None, help="k values of pass@k (each <= --samples; default 1 and N)")
    parser.add_argument("--temperature", type=float, nargs="+", default=None,
                        help="sampling temperatures of --samples (default: config.rollout.temperature)")
    parser.add_argument("--out", default=None, help="output directory for eval.json and the rollouts")
    parser.add_argument("--env", default=None, choices=("bfcl", "agentdojo"),
                        help="an external benchmark's tasks of --split instead of the sandbox's (per-category accuracy)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.eval import HARNESS_MODES, Evaluator, evaluate, evaluation_tasks, format_eval, format_passk, pass_ks, passk_report
    from mpa_jax.rollout.engines import RolloutSetupError

    if args.harness not in HARNESS_MODES:
        raise UserError(f"--harness must be one of {', '.join(HARNESS_MODES)}, got {args.harness!r}")
    if args.k is not None and args.k < 1:
        raise UserError(f"--k must be >= 1, got {args.k}")
    if min(args.seen, args.held_out, args.samples) < 0:
        raise UserError("--seen, --held-out and --samples must be >= 0")
    # the CLI resolved the start and fitted the config to it: model.init_from is its HF directory
    ckpt = str(config.model.init_from) if args.checkpoint != "untrained" and args.start is not None else None
    name = "untrained" if ckpt is None else args.start.name
    out = args.out or os.path.join(args.workdir, "eval", name)
    split = args.split or str(config.eval.split)
    try:
        tasks = None
        if args.env:  # an external benchmark: its own split's tasks, stratified like the sandbox's
            from mpa_jax.envs.base import kind_tasks
            from mpa_jax.eval.tasks import stratified

            tasks = stratified(kind_tasks(args.env, config, split), int(config.eval.max_tasks if args.max_tasks is None else args.max_tasks))
        elif args.seen or args.held_out:
            tasks = evaluation_tasks(split, n_seen=args.seen, n_held_out=args.held_out, seed=int(config.tasks.seed),
                                 per_template=int(config.tasks.per_template))
        if args.samples:
            ks = pass_ks(args.samples, args.pass_k or ())
            temps = args.temperature or [float(config.rollout.temperature)]
            if min(temps) <= 0:
                raise UserError(f"--temperature {temps}: must be > 0 (greedy is always reported)")
            if tasks is None:
                tasks = evaluation_tasks(split, n=int(config.eval.max_tasks if args.max_tasks is None else args.max_tasks),
                                     seed=int(config.tasks.seed), per_template=int(config.tasks.per_template))
            ev = Evaluator(config, tasks)
            report = passk_report(ev, ev.engine_for(ckpt, args.workdir), out, samples=args.samples, ks=ks, temperatures=temps)
            report.update(checkpoint=os.path.abspath(ckpt) if ckpt else None, split=split)
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "passk.json"), "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2, sort_keys=True)
            print(format_passk(report))
            print(f"wrote {os.path.join(out, 'passk.json')}")
            return 0
        if args.pass_k or args.temperature:
            raise UserError("--pass-k/--temperature need --samples N")
        report = evaluate(config, ckpt, out_dir=out, split=split, harness=args.harness, k=args.k, tasks=tasks,
                          max_tasks=args.max_tasks, workdir=args.workdir)
    except (RolloutSetupError, ValueError) as e:
        raise UserError(str(e)) from None
    print(format_eval(report))
    print(f"wrote {os.path.join(out, 'eval.json')}")
    return 0
