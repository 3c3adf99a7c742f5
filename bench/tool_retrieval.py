"""Tool retrieval over the whole catalog: recall@k of the gold solutions' tools, and per-query latency.

    python bench/tool_retrieval.py [--split test] [--k 8] [--ks 3,5,8,10,16] [--no-learned] [--json]

The index is the one the harness uses with `harness.tools = "catalog"` (BM25 over tool texts + structural
companions + co-occurrence companions learned from the *train* split's gold plans; never the evaluated
split). Queries are what the planner sees first: the task's history and instruction. Recall@k counts a
gold tool (including fallbacks) as found when it is among the k tools offered. Target: >= 0.95 at k = 8.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--k", type=int, default=8, help="the headline k")
    ap.add_argument("--ks", default="3,5,8,10,16", help="every k to report")
    ap.add_argument("--no-learned", action="store_true", help="structural companions only (no train-split statistics)")
    ap.add_argument("--max-tasks", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from mpa_jax.envs import load_tasks
    from mpa_jax.envs.benchmark import _used_tools
    from mpa_jax.envs.tools import TOOLS
    from mpa_jax.harness import retrieval as R

    if args.split == "train" and not args.no_learned:
        print("warning: evaluating on the split the companions were learned from", file=sys.stderr)
    t0 = time.perf_counter()
    index = R.catalog_index(learned=not args.no_learned)
    build_s = time.perf_counter() - t0
    tasks = load_tasks(args.split)
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    ks = sorted({int(k) for k in args.ks.split(",")} | {args.k})
    kmax = max(ks)
    hits = Counter()
    total = 0
    by_cat: dict[str, list[int]] = {}
    lat = []
    for task in tasks:
        query = R.request_query([*task.history, {"role": "user", "content": task.instruction}])
        t = time.perf_counter()
        ranked = index.search(query, kmax)
        lat.append(time.perf_counter() - t)
        gold = set(_used_tools(task.gold))
        total += len(gold)
        for k in ks:
            hits[k] += len(gold & set(ranked[:k]))
        c = by_cat.setdefault(task.category, [0, 0])
        c[0] += len(gold & set(ranked[: args.k]))
        c[1] += len(gold)
    out = {
        "split": args.split, "tasks": len(tasks), "catalog_tools": len(TOOLS), "gold_tools": total,
        "recall": {str(k): round(hits[k] / max(1, total), 4) for k in ks},
        "recall_by_category": {c: round(h / max(1, n), 4) for c, (h, n) in sorted(by_cat.items())},
        "latency_ms": {"mean": round(1000 * statistics.mean(lat), 4), "p50": round(1000 * statistics.median(lat), 4),
                       "p99": round(1000 * sorted(lat)[int(0.99 * (len(lat) - 1))], 4)},
        "index_build_s": round(build_s, 3), "learned_companions": not args.no_learned,
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"split {args.split}: {len(tasks)} tasks, {total} gold tool uses, catalog {len(TOOLS)} tools"
              f" (learned companions: {not args.no_learned}; index built in {build_s:.2f} s)")
        for k in ks:
            mark = "  <- target >= 0.95" if k == args.k else ""
            print(f"  recall@{k:<3} {out['recall'][str(k)]:.4f}{mark}")
        print("  by category @%d: %s" % (args.k, ", ".join(f"{c} {v:.3f}" for c, v in out["recall_by_category"].items())))
        lm = out["latency_ms"]
        print(f"  latency per query: mean {lm['mean']:.3f} ms, p50 {lm['p50']:.3f} ms, p99 {lm['p99']:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
