"""Slot prefill shape buckets: how many prefill programs an evaluation compiles, and the padding they cost.

    python bench/prefill_buckets.py                       # the starter, 144 dev tasks (rl-lift's), greedy
    python bench/prefill_buckets.py --tasks 24 --buckets 256:2 1024:4

Runs the same greedy evaluation (harness off) once per bucket setting `STEP:ROWS` (`rollout.prefill_step`,
`rollout.prefill_row_base`) and records every slot prefill call: the distinct (rows, width) shapes (one compiled
program each; at Qwen3-1.7B shape on an H200 each took 11-23 s to compile, docs/perf.md) and the padded prompt
tokens against the real ones. The episodes' success must not change (the buckets change only padding).
On CPU at the starter's size compiles are cheap; the counts are what carry over to an accelerator.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(config, tasks, checkpoint: str, step: int, rows: int, out: str) -> dict:
    """One evaluation with prefill buckets (`step`, `rows`); its prefill shapes, padding and success."""
    from mpa_jax.eval import Evaluator
    from mpa_jax.rollout import slots

    config.rollout.prefill_step, config.rollout.prefill_row_base = step, rows
    shapes: set[tuple[int, int]] = set()
    tokens = {"real": 0, "padded": 0}
    original = slots.SlotDecoder.prefill

    def recording(self, prompts, slot_ids):
        r = self.replicas
        nb = slots._rows(max([s % r for s in slot_ids].count(k) for k in range(r)), self.prefill_row_base, self.max_prefill)
        width = self.width(max(len(p) for p in prompts))
        shapes.add((nb, width))
        tokens["real"] += sum(len(p) for p in prompts)
        tokens["padded"] += r * nb * width
        return original(self, prompts, slot_ids)

    slots.SlotDecoder.prefill = recording
    try:
        t0 = time.perf_counter()
        rep = Evaluator(config, tasks, progress=False).evaluate(checkpoint, out_dir=out, label=f"prefill {step}:{rows}")
    finally:
        slots.SlotDecoder.prefill = original
    return {"programs": len(shapes), "widths": len({w for _, w in shapes}), "real": tokens["real"], "padded": tokens["padded"],
            "success": rep["harness"]["off"]["overall"]["success"], "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, "starter"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "rl_lift.py"))
    ap.add_argument("--tasks", type=int, default=144, help="dev tasks: two thirds of seen templates, a third held out")
    ap.add_argument("--buckets", nargs="+", default=["256:2", "1024:4"], help="STEP:ROWS settings; the first is the baseline")
    ap.add_argument("--out", default="/tmp/mpa_prefill_buckets")
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from mpa_jax.config import load_config_file
    from mpa_jax.eval import select_tasks

    config = load_config_file(a.config)
    n_held = a.tasks // 3
    tasks = select_tasks("dev", n_seen=a.tasks - n_held, n_held_out=n_held, seed=int(config.tasks.seed),
                         per_template=int(config.tasks.per_template))
    results = {}
    for b in a.buckets:
        step, rows = (int(x) for x in b.split(":"))
        r = measure(config, tasks, a.checkpoint, step, rows, os.path.join(a.out, b.replace(":", "_")))
        results[b] = r
        print(f"prefill buckets {b}: {r['programs']} programs ({r['widths']} widths), padded / real prompt tokens "
              f"{r['padded'] / r['real']:.3f}, success {r['success']:.3f}, {r['wall_s']:.1f} s", flush=True)
    base = a.buckets[0]
    for b, r in results.items():
        row = {"figure": f"prefill programs, buckets {b}", "unit": "programs", "ours": r["programs"], "direction": "lower"}
        pad = {"figure": f"prefill padding, buckets {b}", "unit": "padded/real tokens", "ours": round(r["padded"] / r["real"], 3),
               "direction": "lower"}
        if b != base:
            row.update(peer=f"buckets {base}", peer_value=results[base]["programs"])
            pad.update(peer=f"buckets {base}", peer_value=round(results[base]["padded"] / results[base]["real"], 3))
        print("BENCH_ROW " + json.dumps(row))
        print("BENCH_ROW " + json.dumps(pad))
    if len({r["success"] for r in results.values()}) != 1:
        sys.exit(f"success differs between bucket settings: {json.dumps({b: r['success'] for b, r in results.items()})}")


if __name__ == "__main__":
    main()
