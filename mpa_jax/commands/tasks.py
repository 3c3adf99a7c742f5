"""`mpa tasks --split test --out tasks.jsonl`: write a split of the sandbox benchmark and print its counts.

Generation is deterministic (config.tasks.seed, config.tasks.per_template): the same config gives the same
bytes. Every emitted task has passed the quality gate.
"""
from __future__ import annotations

import argparse
import collections
import os
import time

import ml_collections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = 'example: mpa tasks --split dev --out runs/dev.jsonl'
    parser.add_argument("--split", default="test", help="train | dev | test (default: test, the benchmark)")
    parser.add_argument("--out", default=None, help="output JSONL (default: <workdir>/tasks_<split>.jsonl)")
    parser.add_argument("--no-cache", action="store_true", help="regenerate even when a cached copy exists")


def run(args: argparse.Namespace, config: ml_collections.ConfigDict) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from mpa_jax.errors import UserError
    from mpa_jax.envs import CATEGORIES, DOMAINS, SPLITS, load_tasks, tools_used, write_jsonl

    if args.split not in SPLITS:
        raise UserError(f"--split must be one of {', '.join(SPLITS)}, got {args.split!r}")
    seed = int(config.tasks.seed)
    per_template = int(config.tasks.per_template)
    if per_template < 0:
        raise UserError(f"config.tasks.per_template must be >= 0, got {per_template}")
    out = args.out or os.path.join(args.workdir, f"tasks_{args.split}.jsonl")
    console = Console(stderr=True)
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]generating {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} templates"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        bar = progress.add_task(args.split, total=None)

        def tick(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)

        tasks = load_tasks(args.split, seed=seed, per_template=per_template, cache=not args.no_cache, progress=tick)
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    write_jsonl(out, tasks)

    counts = collections.Counter((t.domain, t.category) for t in tasks)
    table = Table(title=f"{args.split}: {len(tasks)} tasks, {len(tools_used(tasks))} tools used by gold, "
                        f"{len({t.template for t in tasks})} templates")
    table.add_column("domain")
    for c in CATEGORIES:
        table.add_column(c, justify="right")
    table.add_column("total", justify="right")
    for d in DOMAINS:
        row = [counts[(d, c)] for c in CATEGORIES]
        table.add_row(d, *map(str, row), str(sum(row)))
    tot = [sum(counts[(d, c)] for d in DOMAINS) for c in CATEGORIES]
    table.add_row("total", *map(str, tot), str(sum(tot)), style="bold")
    Console().print(table)
    console.print(f"wrote {out} ({time.perf_counter() - t0:.1f}s)")
    return 0
