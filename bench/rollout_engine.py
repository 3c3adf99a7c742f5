"""Rollout throughput of the one engine: round-synchronous vs continuous episodes, side by side in one run.

The starter planner (`starter/`, the shipped HF checkpoint, its tokenizer and compact context) plays
`--episodes` (default 64) live sandbox episodes of the benchmark's dev split (tasks drawn across the
split: every category, so turns and lengths are mixed), temperature `--temperature` (default 1, as RL
samples), the same per-(episode, turn) seeds in every mode. Modes:

- `batch`: the round-synchronous path of `rollout.runner.EpisodeRunner` (every live episode's turn in one
  `generate` per round and token budget; a round waits for its longest turn) over the whole-batch
  program (`Engine.generate_batch`: bucketed prefill + one jitted decode loop per call): what RL and
  evaluation ran before the one engine;
- `rounds`: the same rounds over the engine's slots (`generate` = submit every prompt, wait for all);
- `continuous` (one per `--slots` value): the runner's continuous path, the engine itself: each episode's
  next turn is submitted (`Engine.submit`) as soon as its feedback is ready, no rounds.

All three are the same `EpisodeRunner.run` (the first two see the engine through an adapter without
`submit`), so every mode does the same work per episode.

Each mode runs twice on the same tasks and seeds; the second run is timed (its programs are compiled;
the compile count of the timed run is printed). Printed per mode: episodes/s, sampled tokens/s, wall,
decode-slot utilisation (slot-steps that emitted a token / all slot-steps: `slots busy`; the same over
chunks that started with requests waiting for a slot, every slot taken: `while queued`), the share of
the decode rows actually computed that emitted a token (`rows busy`: the slot programs run a prefix of
the slots; the whole-batch program runs its padded rows until each replica's longest row ends), and
how many episodes have exactly the first mode's tokens.

Usage: `python bench/rollout_engine.py [--episodes 64] [--slots 64 32] [--replicas 0] [--chunk 8]
[--temperature 1.0] [--modes batch rounds continuous]`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WholeBatch:
    """The engine as the runner saw it before: `generate` = one whole-batch program per call. Counts
    rows x decode steps per replica of every call (the program's loop runs until its longest row ends)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.row_steps = 0
        self.tokens = 0

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def generate(self, prompts, params, seeds=None):
        out = self.engine.generate_batch(prompts, params, seeds)
        self._count(prompts, out)
        return out

    def _count(self, prompts, out) -> None:
        """Rows x steps as `Engine._batch_rows` lays the batch out: sorted by prompt length, calls of
        max_batch rows, each padded to a power of two split evenly over the replicas."""
        r = self.engine.replicas
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for lo in range(0, len(order), self.engine.max_batch):
            idx = order[lo: lo + self.engine.max_batch]
            b = -(-(1 << (len(idx) - 1).bit_length()) // r) * r
            per = b // r
            for k in range(r):
                part = [len(out[i].token_ids) for i in idx[k * per: (k + 1) * per]]
                if part:
                    self.row_steps += per * max(part)
            self.tokens += sum(len(out[i].token_ids) for i in idx)


class Rounds:
    """The engine without `submit`: the runner then runs rounds of `generate` (over the slots)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def generate(self, prompts, params, seeds=None):
        return self.engine.generate(prompts, params, seeds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starter", default=os.path.join(ROOT, "starter"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "starter.py"))
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--slots", type=int, nargs="+", default=[64, 32], help="continuous mode: decode slots (one run each)")
    ap.add_argument("--replicas", type=int, default=0, help="engine weight replicas (0: one per usable core)")
    ap.add_argument("--chunk", type=int, default=8, help="decode steps per chunk")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--modes", nargs="+", choices=["batch", "rounds", "continuous"], default=["batch", "rounds", "continuous"])
    ap.add_argument("--warm-runs", type=int, default=1, help="untimed runs of each mode first (compiles)")
    args = ap.parse_args(argv)
    replicas = args.replicas or len(os.sched_getaffinity(0))
    # One XLA host device per replica; read by XLA at start-up, so set before jax is imported.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={replicas}").strip()

    from mpa_jax import tokenizer as tk
    from mpa_jax.config import load_config_file
    from mpa_jax.envs import load_tasks
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.runner import EpisodeConfig, EpisodeRunner
    from mpa_jax.sft.starter import load_starter, with_starter

    config = with_starter(load_config_file(args.config), load_starter(args.starter))  # model shape, tokenizer, compact context
    tok = tk.load_tokenizer(args.starter)
    dev = load_tasks("dev")
    stride = max(len(dev) // args.episodes, 1)
    tasks = dev[::stride][: args.episodes]  # across the split: every category, mixed lengths
    cfg = EpisodeConfig.from_config(config.rollout, seed=0, temperature=args.temperature, batch_size=len(tasks),
                                    planner="bench")
    runner = EpisodeRunner.from_config(config, harness=False)  # the planner and the sandbox, nothing between
    slot_len = int(config.rollout.max_total_tokens)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; starter planner, {len(tasks)} dev episodes "
          f"({', '.join(f'{c} {sum(t.category == c for t in tasks)}' for c in sorted({t.category for t in tasks}))}), "
          f"temperature {args.temperature}, max_new {cfg.max_new_tokens}/turn, max_total {cfg.max_total_tokens}, "
          f"replicas {replicas}, chunk {args.chunk}, slot_len {slot_len}", flush=True)

    def engine(slots: int) -> Engine:
        return Engine.from_pretrained(args.starter, dtype="float32", slots=slots, slot_len=slot_len, chunk=args.chunk,
                                      replicas=replicas, max_batch=len(tasks), vocab_limit=tok.vocab_size)

    def timed(fn, eng):
        for _ in range(args.warm_runs):
            fn()  # compiles what this mode needs
        c0, s0 = eng.compiles, dict(eng.stats())
        t0 = time.perf_counter()
        trajs = fn()
        wall = time.perf_counter() - t0
        return trajs, wall, eng.compiles - c0, s0, dict(eng.stats())

    rows = []
    ref = None
    for mode in args.modes:
        for slots in (args.slots if mode == "continuous" else [len(tasks)]):
            eng = engine(slots)
            wb = WholeBatch(eng)
            seen = {"batch": wb, "rounds": Rounds(eng), "continuous": eng}[mode]
            fn = lambda: runner.run(seen, tok, tasks, cfg)  # noqa: E731
            trajs, wall, compiles, s0, s1 = timed(fn, eng)
            tokens = sum(int(t.costs["output_tokens"]) for t in trajs)
            if mode == "batch":
                wb.row_steps = wb.tokens = 0
                fn()  # once more, counting rows x steps of this (identical) run alone
                busy = busy_q = float("nan")  # no slots: rows exist per call only
                computed = wb.tokens / max(wb.row_steps, 1)
            else:
                d = lambda k: s1.get(k, 0.0) - s0.get(k, 0.0)  # noqa: E731
                busy = d("busy_slot_steps") / max(d("slot_steps"), 1)
                computed = d("busy_slot_steps") / max(d("computed_slot_steps"), 1)
                busy_q = d("queued_busy_slot_steps") / d("queued_slot_steps") if d("queued_slot_steps") else float("nan")
            if ref is None:
                ref = [t.tokens for t in trajs]
            same = sum(t.tokens == r for t, r in zip(trajs, ref))
            succ = sum(bool(t.verification and t.verification.success) for t in trajs)
            rows.append((mode, slots if mode != "batch" else "-", len(trajs) / wall, tokens / wall, wall, busy, busy_q,
                         computed, compiles, same, succ))
            split = "" if mode == "batch" else ", engine thread: " + ", ".join(
                f"{k} {s1.get(k + '_s', 0.0) - s0.get(k + '_s', 0.0):.1f} s" for k in ("admit", "decode", "deliver"))
            print(f"  {mode} (slots {slots}): {wall:.1f} s{split}", flush=True)
            eng.close()
    print(f"{'mode':>10} {'slots':>5} {'episodes/s':>10} {'tok/s':>8} {'wall s':>7} {'slots busy':>10} {'while queued':>12} "
          f"{'rows busy':>9} {'compiles':>8} {'same tokens':>11} {'success':>7}")
    f = lambda x: f"{x:.3f}" if x == x else "-"  # noqa: E731
    for mode, slots, eps, tps, wall, busy, busy_q, computed, compiles, same, succ in rows:
        print(f"{mode:>10} {slots!s:>5} {eps:>10.3f} {tps:>8.1f} {wall:>7.1f} {f(busy):>10} {f(busy_q):>12} {f(computed):>9} "
              f"{compiles:>8} {same:>5}/{len(ref):<5} {succ:>7}")
    runner.close()
    base = rows[0][2]
    print("episodes/s relative to the first mode: " + ", ".join(f"{m} ({s}) {e / base:.2f}x" for m, s, e, *_ in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
