"""Ground-truth replays of the external benchmarks through the token-level runner, with corrupted replays.

    .venv/bin/python bench/external_replay.py [--env bfcl,agentdojo] [--split all] [--batch 16]

For every task of the split: the gold plan replayed turn by turn by `ScriptedEngine` (one assistant turn per
gold step, rendered by the chat template) through `EpisodeRunner`, scored by the benchmark's own checker
(BFCL's multi_turn_checker, AgentDojo's utility functions). Then the same with corrupted plans: BFCL one call
dropped (the middle one) / one argument of the middle call changed; AgentDojo the last call dropped and the
answer replaced. Prints a table per category and `BENCH_ROW {json}` lines. Tests run a stratified subset of
this (tests/unit/test_bfcl.py, tests/unit/test_agentdojo.py); this runs all of it (~2-4 min on 2 cores).
"""
from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.envs.base import make_env  # noqa: E402
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes  # noqa: E402
from mpa_jax.rollout.testing import ScriptedEngine  # noqa: E402


def texts(task) -> list[str]:
    return [tk.format_tool_call(s["name"], s["arguments"]) if s["kind"] == "tool_call" else s["text"] for s in task.gold]


def _changed(v):
    return v + "_x" if isinstance(v, str) else (not v) if isinstance(v, bool) else v + 7 if isinstance(v, (int, float)) \
        else ["x"] if isinstance(v, list) else {}


def bfcl_drop(task):
    calls = [j for j, s in enumerate(task.gold) if s["kind"] == "tool_call"]
    return dataclasses.replace(task, gold=[s for j, s in enumerate(task.gold) if j != calls[len(calls) // 2]])


def bfcl_arg(task):
    gold = copy.deepcopy(task.gold)
    calls = [s for s in gold if s["kind"] == "tool_call" and s["arguments"]]
    s = calls[len(calls) // 2]
    k = sorted(s["arguments"])[0]
    s["arguments"][k] = _changed(s["arguments"][k])
    return dataclasses.replace(task, gold=gold)


def agentdojo_corrupt(task):
    calls = [j for j, s in enumerate(task.gold) if s["kind"] == "tool_call"]
    gold = [copy.deepcopy(s) for j, s in enumerate(task.gold) if j != calls[-1]]
    gold[-1]["text"] = "Done."
    return dataclasses.replace(task, gold=gold)


def replay(tok, kind: str, tasks, batch: int):
    """One runner pass; tasks whose first request is the same text run in separate passes (the script finds
    a prompt's task by its request)."""
    out = {}
    pending = list(tasks)
    while pending:
        seen, now, later = set(), [], []
        for t in pending:
            (later if t.instruction in seen else now).append(t)
            seen.add(t.instruction)
        by_text = {t.instruction: t for t in now}

        def script(prompt, _i, by_text=by_text):
            text = tok.decode(prompt)
            task = next(t for ins, t in by_text.items() if f"<|im_start|>user\n{ins}<|im_end|>" in text)
            return texts(task)[text.count("<|im_start|>assistant") - 1]

        # a gold turn can be long (a BFCL long_context tweet quotes ~4,000 characters): turns are never cut here
        cfg = EpisodeConfig.defaults(max_turns=40, max_new_tokens=32_768, max_total_tokens=1_000_000, batch_size=batch)
        for t, traj in zip(now, run_episodes(ScriptedEngine(tok, script), tok, now, lambda: make_env(kind), cfg)):
            out[t.id] = traj
        pending = later
    return [out[t.id] for t in tasks]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="bfcl,agentdojo")
    ap.add_argument("--split", default="all")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--category", default="", help="only this task category (e.g. bfcl_long_context)")
    ap.add_argument("--no-corrupt", action="store_true", help="the ground-truth replay only")
    args = ap.parse_args()
    tok = tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
    corruptions = {"bfcl": {"one call dropped": bfcl_drop, "one argument changed": bfcl_arg},
                   "agentdojo": {"last call dropped + answer replaced": agentdojo_corrupt}}
    for kind in args.env.split(","):
        env = make_env(kind)
        tasks = [t for t in env.tasks(args.split) if not args.category or t.category == args.category]
        env.close()
        t0 = time.perf_counter()
        trajs = replay(tok, kind, tasks, args.batch)
        wall = time.perf_counter() - t0
        per = collections.defaultdict(lambda: [0, 0])
        for t, tr in zip(tasks, trajs):
            per[t.category][0] += int(tr.verification.success)
            per[t.category][1] += 1
        ok = sum(v[0] for v in per.values())
        print(f"{kind}: ground-truth replay through the runner: {ok}/{len(tasks)} ({wall:.1f} s, "
              f"{sum(len(tr.tokens) for tr in trajs) / len(trajs):.0f} tokens per episode)")
        for cat, (s, n) in sorted(per.items()):
            print(f"  {cat:<24} {s}/{n}")
        row = {"bench": "external_replay", "env": kind, "split": args.split, "tasks": len(tasks), "replay_success": ok,
               "wall_s": round(wall, 1)}
        for name, corrupt in ({} if args.no_corrupt else corruptions[kind]).items():
            bad = replay(tok, kind, [corrupt(t) for t in tasks], args.batch)
            passed = [t.id for t, tr in zip(tasks, bad) if tr.verification.success]
            print(f"  corrupted ({name}): {len(tasks) - len(passed)}/{len(tasks)} fail; still passing: {passed}")
            row[f"corrupted_pass[{name}]"] = len(passed)
        print("BENCH_ROW " + json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
