"""`mpa demo`: the largest end-to-end path that exists, on the embedded default (`make demo`).

tasks -> the project's tokenizer -> oracle demonstrations on the train split -> rollouts of the
untrained model on held-out tasks -> SFT (planning cold start) -> rollouts of the SFT model on the same
held-out tasks; the two are printed side by side and written to `<workdir>/demo_summary.json`.
The closed loop (CARE RL, harness refinement) grows from here in later rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from mpa_jax.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", default=None, help="held-out split to evaluate on (default: config.rollout.split)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per evaluation (default: config.rollout.max_tasks)")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory's earlier demo outputs first")


def stratified(tasks: list[Any], n: int) -> list[Any]:
    """`n` tasks spread over (domain, category) cells, deterministically.

    Cells are visited on a diagonal walk (the k-th visit takes domain k mod D and category
    (k mod D + k div D) mod C), so any D consecutive picks cover every domain and the categories
    rotate; then round-robin in depth. The split's head alone would be one domain.
    """
    cells: dict[tuple[str, str], list[Any]] = {}
    for t in tasks:
        cells.setdefault((t.domain, t.category), []).append(t)
    domains = sorted({d for d, _ in cells})
    categories = sorted({c for _, c in cells})
    nd, nc = len(domains), len(categories)
    walk = [(domains[k % nd], categories[(k % nd + k // nd) % nc]) for k in range(nd * nc)]
    order = [cell for cell in walk if cell in cells]
    out: list[Any] = []
    depth = 0
    while len(out) < min(n, len(tasks)):
        for key in order:
            if depth < len(cells[key]) and len(out) < n:
                out.append(cells[key][depth])
        depth += 1
    return out


def tool_call_outcomes(path: str) -> dict[str, int]:
    """Count the tool calls of a rollout file by outcome: "ok" or the Feedback's error code."""
    from mpa_jax.envs import Trajectory, read_jsonl

    counts: dict[str, int] = {}
    for traj in read_jsonl(path, Trajectory):
        for step in traj.steps:
            if step.action.kind == "tool_call" and step.feedback is not None:
                key = "ok" if step.feedback.ok else str(step.feedback.error_code.value)
                counts[key] = counts.get(key, 0) + 1
    return counts


def _row(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "success_rate": summary["success_rate"],
        "mean_score": summary["mean_score"],
        "mean_output_tokens": summary["mean_output_tokens"],
        "mean_tool_calls": summary["mean_tool_calls"],
        "by_category": {k: v["success_rate"] for k, v in summary["by_category"].items()},
        "by_domain": {k: v["success_rate"] for k, v in summary["by_domain"].items()},
        "tool_call_outcomes": tool_call_outcomes(summary["out_path"]),
    }


def run(args: argparse.Namespace, config: Any) -> int:
    from rich.console import Console

    from mpa_jax import rollout, tokenizer
    from mpa_jax.commands.oracle import make_oracle_trajectories
    from mpa_jax.envs import load_tasks
    from mpa_jax.rollout.run import format_comparison, format_summary
    from mpa_jax.sft import run_sft

    console = Console()
    workdir = args.workdir
    if args.fresh:
        for sub in ("sft", "rollouts", f"oracle-{config.oracle.split}.jsonl", "demo_summary.json"):
            path = os.path.join(workdir, sub)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    t0 = time.perf_counter()
    split = args.split or str(config.rollout.split)
    if split == str(config.oracle.split):
        raise UserError(f"held-out split {split!r} is the split the demonstrations come from; pick another with --split")
    n = int(args.eval_tasks if args.eval_tasks is not None else config.rollout.max_tasks)
    held_out = stratified(load_tasks(split), n)

    console.rule("[bold]1. tokenizer")
    tok = tokenizer.tokenizer_for_config(config, workdir)
    console.print(f"tokenizer: {tok.vocab_size} ids")
    if tok.vocab_size > int(config.model.vocab_size):
        raise UserError(f"tokenizer has {tok.vocab_size} ids, more than config.model.vocab_size={config.model.vocab_size}")

    console.rule(f"[bold]2. oracle demonstrations ({config.oracle.split} split)")
    traj_path = make_oracle_trajectories(config, workdir, split=str(config.oracle.split), max_tasks=int(config.oracle.max_tasks))

    console.rule(f"[bold]3. untrained model on {len(held_out)} held-out {split} tasks")
    rollouts_dir = os.path.join(workdir, "rollouts")
    before = rollout.run_rollouts(config, None, tasks=held_out, out_path=os.path.join(rollouts_dir, "untrained.jsonl"),
                                  workdir=workdir, tokenizer=tok, label="untrained")
    console.print(format_summary(before))

    console.rule("[bold]4. SFT: planning cold start")
    result = run_sft(config, os.path.join(workdir, "sft"), traj_path, export=True)
    console.print(f"SFT: {result.steps} steps, train loss {result.train_loss:.3f}, held-out loss "
                  f"{result.eval_loss if result.eval_loss is None else round(result.eval_loss, 3)}, "
                  f"unigram baseline {result.unigram_loss:.3f}; exported to {result.export_dir}")

    console.rule(f"[bold]5. SFT model on the same {len(held_out)} held-out tasks")
    after = rollout.run_rollouts(config, result.export_dir, tasks=held_out, out_path=os.path.join(rollouts_dir, "sft.jsonl"),
                                 workdir=workdir, label="sft")

    report = {
        "split": split,
        "tasks": len(held_out),
        "untrained": _row(before),
        "sft": _row(after),
        "sft_train_loss": result.train_loss,
        "sft_eval_loss": result.eval_loss,
        "unigram_loss": result.unigram_loss,
        "export_dir": result.export_dir,
        "wall_s": time.perf_counter() - t0,
    }
    with open(os.path.join(workdir, "demo_summary.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    console.rule(f"[bold]held-out success on {len(held_out)} {split} tasks (greedy): untrained vs SFT")
    console.print(format_comparison({"untrained": before, "SFT": after}), highlight=False)
    for label, row in (("untrained", report["untrained"]), ("SFT", report["sft"])):
        outcomes = row["tool_call_outcomes"]
        calls = sum(outcomes.values())
        errors = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]) if k != "ok")
        console.print(f"{label:>10}: {row['mean_output_tokens']:.1f} output tokens and {row['mean_tool_calls']:.2f} tool calls per task;"
                      f" {outcomes.get('ok', 0)}/{calls} calls executed" + (f" (errors: {errors})" if errors else ""))
    console.print(f"run directory: {workdir}  ({report['wall_s']:.0f} s)")
    return 0
