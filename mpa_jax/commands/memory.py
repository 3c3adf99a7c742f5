"""`mpa memory suite --tokens 1m --out DIR` and `mpa memory eval --suite DIR --out FILE.json`.

`suite` writes a BEAM-style long-history suite (deterministic from config.memory.seed); `eval` ingests it into
a memory store (DIR/memory.sqlite, reused when complete) and reports evidence recall of memory vs the
long-context baseline at config.memory.budget_tokens, per ability, plus answer accuracy with a reader
(`scripted`, or `openai` against --base-url/--model). No jax is imported.
"""
from __future__ import annotations

import argparse
import os
import time

import ml_collections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = 'examples: mpa memory suite --tokens 100k --out runs/mem100k   |   mpa memory eval --suite runs/mem100k --out runs/mem.json'
    parser.add_argument("action", choices=("suite", "eval"), help="suite: write a suite; eval: evaluate memory on one")
    parser.add_argument("--tokens", default=None, help="suite: history size, 100k | 500k | 1m | 10m (or a number)")
    parser.add_argument("--out", default=None, help="suite: output folder; eval: output JSON file")
    parser.add_argument("--suite", default=None, help="eval: the suite folder")
    parser.add_argument("--budget", type=int, default=None, help="eval: context budget in tokens (default config.memory.budget_tokens)")
    parser.add_argument("--reader", default=None, help="eval: scripted | openai | none (default config.memory.reader)")
    parser.add_argument("--base-url", default=None, help="eval --reader openai: OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--model", default="default", help="eval --reader openai: model name")
    parser.add_argument("--store", default=None, help="eval: store path (default SUITE/memory.sqlite)")


def run(args: argparse.Namespace, config: ml_collections.ConfigDict) -> int:
    from rich.console import Console

    from mpa_jax.errors import UserError

    console = Console(stderr=True)
    mem = config.memory
    if args.action == "suite":
        from mpa_jax.harness.memory.suite import parse_size, write_suite

        if not args.tokens:
            raise UserError("memory suite needs --tokens (100k, 500k, 1m or 10m)")
        if not args.out:
            raise UserError("memory suite needs --out DIR")
        try:
            tokens = parse_size(args.tokens)
        except ValueError as e:
            raise UserError(str(e)) from None
        t0 = time.perf_counter()
        meta = write_suite(args.out, tokens, seed=int(mem.seed), per_ability=int(mem.per_ability),
                           persona_seed=int(mem.persona_seed), paraphrase=float(mem.paraphrase))
        console.print(f"wrote {args.out}: {meta['tokens']:,} tokens, {meta['turns']:,} turns, {meta['sessions']:,} sessions, "
                      f"{meta['questions']} questions ({time.perf_counter() - t0:.1f}s)")
        return 0

    from mpa_jax.harness.memory.evaluate import OpenAIReader, ScriptedReader, evaluate_suite, write_report

    if not args.suite or not os.path.isfile(os.path.join(args.suite, "meta.json")):
        raise UserError(f"memory eval needs --suite DIR holding a suite (meta.json), got {args.suite!r}")
    if not args.out:
        raise UserError("memory eval needs --out FILE.json")
    budget = int(args.budget if args.budget is not None else mem.budget_tokens)
    if budget < 64:
        raise UserError(f"--budget must be at least 64 tokens, got {budget}")
    kind = args.reader or str(mem.reader)
    if kind == "scripted":
        reader = ScriptedReader()
    elif kind == "openai":
        if not args.base_url:
            raise UserError("--reader openai needs --base-url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:30000/v1)")
        reader = OpenAIReader(args.base_url, args.model)
    elif kind == "none":
        reader = None
    else:
        raise UserError(f"--reader must be scripted, openai or none, got {kind!r}")
    store_kwargs = mem.store.to_dict()  # recency_weight, entity_weight, candidates, min_coverage, rank_limit
    t0 = time.perf_counter()
    report = evaluate_suite(args.suite, budget_tokens=budget, store_path=args.store, reader=reader, store_kwargs=store_kwargs)
    write_report(report, args.out)
    from rich.table import Table

    t = Table(title=f"{report['tokens']:,} tokens, {report['questions']} questions, budget {budget} tokens: evidence recall")
    t.add_column("ability")
    t.add_column("memory", justify="right")
    t.add_column("long context", justify="right")
    acc = report.get("answer_accuracy")
    if acc:
        t.add_column(f"answer acc. memory ({acc['reader']})", justify="right")
        t.add_column("answer acc. long context", justify="right")
    for ab in report["memory"]:
        row = [ab, f"{report['memory'][ab]:.2f}", f"{report['long_context'][ab]:.2f}"]
        if acc:
            row += [f"{acc['memory'][ab]:.2f}", f"{acc['long_context'][ab]:.2f}"]
        t.add_row(*row, style="bold" if ab == "mean" else None)
    Console().print(t)
    console.print(f"wrote {args.out} ({time.perf_counter() - t0:.1f}s)")
    return 0
