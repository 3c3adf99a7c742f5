"""`mpa oracle --split train --out FILE`: demonstrations from the scripted oracle planner (`data.Collector.oracle`).

Each task of the split is solved by the oracle in the config's env kind (`--env`), and the chat is encoded
with the chat template into a Trajectory: token ids, the assistant-only loss mask, log-probs 0 (no
behaviour policy), steps, verification, messages and provenance planner="oracle". Prints a summary.
With `--checkpoint` (a start, as every command names one) the demonstrations are encoded with that
checkpoint's tokenizer and context format, ready for `mpa sft --checkpoint` on it.
"""
from __future__ import annotations

import argparse
import collections
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", default=None, help="task split: train | dev | test, or a task JSONL (default: config.oracle.split)")
    parser.add_argument("--out", default=None, help="trajectory JSONL to write (default: <workdir>/oracle-<split>.jsonl)")
    parser.add_argument("--max-tasks", type=int, default=None, help="at most this many tasks (default: config.oracle.max_tasks; 0 = all)")
    from mpa_jax.cli import add_env_arguments, add_start_argument

    parser.epilog = "example: mpa oracle --checkpoint starter --split train --max-tasks 50 --out runs/demos.jsonl"
    add_start_argument(parser, extra="; the demonstrations use its tokenizer and context format (default: the config's)")
    add_env_arguments(parser)


def _print_summary(out: str, tasks: list[Any], trajs: list[Any], seconds: float, infra: int) -> None:
    from rich.console import Console
    from rich.table import Table

    category = {t.id: t.category for t in tasks}
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for traj in trajs:
        ok = bool(traj.verification and traj.verification.success)
        for key in (category[traj.task_id], "all"):
            stats[key].update(episodes=1, success=int(ok), tokens=len(traj.tokens), loss_tokens=int(sum(traj.loss_mask)),
                              tool_calls=int(traj.costs["tool_calls"]))
    table = Table(title=f"oracle trajectories -> {out} ({seconds:.1f} s" + (f", {infra} infra episodes left out)" if infra else ")"))
    for col in ("category", "episodes", "success", "mean tokens", "mean loss tokens", "mean tool calls"):
        table.add_column(col, justify="right" if col != "category" else "left")
    for key in sorted(stats, key=lambda k: (k == "all", k)):
        s = stats[key]
        n = max(s["episodes"], 1)
        table.add_row(key, str(s["episodes"]), f"{100.0 * s['success'] / n:.1f}%", f"{s['tokens'] / n:.0f}",
                      f"{s['loss_tokens'] / n:.0f}", f"{s['tool_calls'] / n:.1f}")
    Console().print(table)


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import apply_env_arguments
    from mpa_jax.errors import UserError
    from mpa_jax.data import oracle_dataset
    from mpa_jax.envs.base import EnvUnavailable

    kind = apply_env_arguments(args, config)
    split = args.split
    if kind in ("bfcl", "agentdojo"):  # a benchmark's own tasks, as a task JSONL (envs.base.kind_split_file)
        from mpa_jax.envs.base import kind_split_file

        split = kind_split_file(kind, config, split or str(config.oracle.split), args.workdir)
    t0 = time.perf_counter()
    infra: list[str] = []
    try:
        out, tasks, trajs = oracle_dataset(config, args.workdir, split=split, max_tasks=args.max_tasks, out=args.out,
                                           on_infra=lambda task, e: infra.append(f"{task.id}: infra: {type(e).__name__}: {e}"))
    except (ValueError, EnvUnavailable) as e:  # ContractError, tokenizer/vocab mismatch, empty split; a dead device
        raise UserError(str(e)) from None
    for line in infra:
        print(line)
    _print_summary(out, tasks, trajs, time.perf_counter() - t0, len(infra))
    return 0
