"""Memory bench: ingest time of a long-history suite, search latency p50/p99, store size on disk.

    nice -n 10 .venv/bin/python bench/memory.py --tokens 10m --dir /tmp/mem10m

Writes the suite into --dir (kept and reused when its meta matches), ingests it into a fresh store
(targets on the 2-core dev box: 10M tokens in under 120 s), then times `search` over the suite's questions
and over queries made from random user turns (target p50 under 20 ms), and `MemoryContext.context` at the
default budget. Prints one JSON object (and writes it to --json when given). No jax.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="10m")
    ap.add_argument("--dir", default="/tmp/mpa_memory_bench")
    ap.add_argument("--queries", type=int, default=400, help="random-turn queries besides the suite's questions")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from mpa_jax.harness.memory import MemoryContext
    from mpa_jax.harness.memory.evaluate import ingest_suite
    from mpa_jax.harness.memory.suite import parse_size, read_history, read_meta, read_questions, write_suite

    tokens = parse_size(args.tokens)
    out: dict = {"tokens_target": tokens}
    meta_path = os.path.join(args.dir, "meta.json")
    if os.path.exists(meta_path) and read_meta(args.dir).get("target_tokens") == tokens:
        out["suite_write_s"] = None  # reused
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        write_suite(args.dir, tokens)
        out["suite_write_s"] = round(time.perf_counter() - t0, 1)
        out["suite_write_cpu_s"] = round(time.process_time() - c0, 1)
    meta = read_meta(args.dir)
    out.update(tokens=meta["tokens"], turns=meta["turns"], sessions=meta["sessions"])

    db = os.path.join(args.dir, "bench.sqlite")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    t0, c0 = time.perf_counter(), time.process_time()
    store = ingest_suite(args.dir, db)
    out["ingest_s"] = round(time.perf_counter() - t0, 1)
    # CPU seconds of this process (SQLite runs in it): on a shared, loaded box the wall time also counts waiting.
    out["ingest_cpu_s"] = round(time.process_time() - c0, 1)
    out["ingest_turns_per_s"] = round(meta["turns"] / max(out["ingest_s"], 1e-3))
    out["load_avg_1m"] = round(os.getloadavg()[0], 1)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    out["store_mb"] = round(sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s)) / 2**20, 1)
    out["history_jsonl_mb"] = round(os.path.getsize(os.path.join(args.dir, "history.jsonl")) / 2**20, 1)

    rng = random.Random(0)
    pick = set(rng.sample(range(1, meta["turns"] + 1), min(args.queries * 3, meta["turns"])))
    rand_q = [t["content"] for t in read_history(args.dir) if t["id"] in pick and t["role"] == "user"][: args.queries]
    suite_q = [q["question"] for q in read_questions(args.dir)]

    def timed(fn, queries):
        fn(queries[0])  # warm the page cache for a fair p50
        lat = []
        for q in queries:
            t = time.perf_counter()
            fn(q)
            lat.append(1000 * (time.perf_counter() - t))
        lat.sort()
        return {"n": len(lat), "p50_ms": round(statistics.median(lat), 2),
                "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2), "max_ms": round(lat[-1], 2)}

    out["search_questions"] = timed(lambda q: store.search(q, limit=10), suite_q)
    out["search_random_turns"] = timed(lambda q: store.search(q, limit=10), rand_q)
    ctx = MemoryContext(store)
    out["context_questions"] = timed(lambda q: ctx.context(q, args.budget), suite_q)
    store.close()
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
