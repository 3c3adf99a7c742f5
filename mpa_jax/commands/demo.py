"""`mpa demo`: the largest end-to-end path that exists, on the embedded default (`make demo`).

Real runs start from a pretrained checkpoint; the CPU demo starts the same way, from the shipped starter
planner (`starter/`, built by `mpa starter` from configs/starter.py; DESIGN section 9). On the same dev tasks,
split into templates seen in training and held-out templates, it prints side by side:

    untrained (the starter's shape, random weights) | the starter | the starter after the demo's SFT refresh

The stages are functions (`load_starter`, `apply_starter`, `evaluate`, `sft_refresh`) so that the closed
loop (`mpa loop`: CARE RL, harness rounds) can reuse them. Without a starter directory the demo trains
from scratch instead (untrained | SFT), as before. Everything lands in `<workdir>/demo_summary.json`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from typing import Any

from mpa_jax.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", default=None, help="held-out split to evaluate on (default: config.rollout.split)")
    parser.add_argument("--eval-tasks", type=int, default=None,
                        help="dev tasks of templates seen in training per evaluation (default: config.demo.eval_seen)")
    parser.add_argument("--eval-held-out", type=int, default=None,
                        help="dev tasks of held-out templates per evaluation (default: config.demo.eval_held_out)")
    parser.add_argument("--starter", default=None, help="starter planner directory (default: config.demo.starter; '' = from scratch)")
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


@dataclasses.dataclass
class Starter:
    """A starter planner directory: an exported HF model + tokenizer + datasheet (mpa_jax.sft.starter)."""

    path: str
    hf_config: dict[str, Any]
    datasheet: dict[str, Any]


def find_starter(path: str) -> str | None:
    """`path` as given, else relative to the repository (the demo may run from anywhere); None if absent."""
    if not path:
        return None
    for cand in (path, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), path)):
        if os.path.isfile(os.path.join(cand, "config.json")):
            return cand
    return None


def load_starter(path: str) -> Starter:
    """Read a starter directory's config.json and datasheet.json (one clear error when either is missing)."""
    from mpa_jax.sft.starter import DATASHEET

    files = {}
    for name in ("config.json", DATASHEET):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise UserError(f"starter directory {path} has no {name}; rebuild it with `mpa starter` or pass --starter ''")
        with open(full, encoding="utf-8") as f:
            files[name] = json.load(f)
    return Starter(path, files["config.json"], files[DATASHEET])


def apply_starter(config: Any, starter: Starter) -> None:
    """Point `config` at the starter: its model shape, its tokenizer, its context format; SFT starts from it."""
    from mpa_jax import models
    from mpa_jax.envs import context

    cfg = models.ModelConfig.from_hf(starter.hf_config)
    for key, value in cfg.to_hf().items():
        if key in config.model and not isinstance(value, (dict, list)):
            config.model[key] = value
    config.model.init_from = os.path.abspath(starter.path)
    config.tokenizer.path = os.path.abspath(starter.path)
    ctx = starter.datasheet.get("context", {})
    config.context.format = ctx.get("format", "json")
    config.context.reasoning = ctx.get("reasoning", "full")
    context.configure(config)
    recipe = starter.datasheet.get("recipe", {})
    for key in ("sft.seq_len", "model.compute_dtype"):  # the refresh packs and computes like the starter's recipe
        if key in recipe:
            section, name = key.split(".")
            config[section][name] = recipe[key]
    config.rollout.max_total_tokens = min(int(config.rollout.max_total_tokens), int(cfg.max_position_embeddings))


def evaluate(config: Any, checkpoint: str | None, tasks: list[Any], out_path: str, label: str, tokenizer: Any) -> dict[str, Any]:
    """Greedy rollouts of `checkpoint` (None = the config's model, untrained) on `tasks`: the rollout summary
    plus `metrics` (success overall, on seen / held-out templates, by category)."""
    from mpa_jax import rollout
    from mpa_jax.sft.success import success_metrics

    summary = rollout.run_rollouts(config, checkpoint, tasks=tasks, out_path=out_path, tokenizer=tokenizer,
                                   greedy=True, label=label)
    summary["metrics"] = success_metrics(summary, out_path, tasks)
    return summary


def sft_refresh(config: Any, workdir: str, *, starter: bool) -> Any:
    """Oracle demonstrations on the train split and SFT (from the starter when `starter`): the SFTResult."""
    from mpa_jax.commands.oracle import make_oracle_trajectories
    from mpa_jax.sft import run_sft

    split, max_tasks = str(config.oracle.split), int(config.oracle.max_tasks)
    if starter:
        from mpa_jax.envs import load_tasks, write_jsonl

        d = config.demo
        config.sft.steps, config.sft.lr, config.sft.warmup_steps = int(d.refresh_steps), float(d.refresh_lr), int(d.refresh_warmup)
        config.sft.batch_size = int(d.refresh_batch_size)
        # a sample spread over domains and categories (the split's head is a few templates of one domain)
        tasks = stratified(load_tasks(split, seed=int(config.tasks.seed), per_template=int(config.tasks.per_template)), int(d.refresh_tasks))
        write_jsonl(os.path.join(workdir, "refresh-tasks.jsonl"), tasks)
        from mpa_jax.data import collect_oracle
        from mpa_jax.tokenizer import model_vocab_size, tokenizer_for_config

        traj_path = os.path.join(workdir, "oracle-refresh-tasks.jsonl")
        trajs = collect_oracle(tasks, tokenizer_for_config(config, workdir), seed=int(config.seed),
                               variants=int(config.oracle.get("variants", 1)), vocab_limit=model_vocab_size(config))
        write_jsonl(traj_path, trajs)
        return run_sft(config, os.path.join(workdir, "sft"), traj_path, export=True)
    traj_path = make_oracle_trajectories(config, workdir, split=split, max_tasks=max_tasks)
    return run_sft(config, os.path.join(workdir, "sft"), traj_path, export=True)


def _pct(m: dict[str, Any], key: str) -> str:
    return f"{100 * m[key]:.1f}%" if key in m else "-"


def run(args: argparse.Namespace, config: Any) -> int:
    from rich.console import Console

    from mpa_jax import tokenizer
    from mpa_jax.rollout.run import format_comparison
    from mpa_jax.sft.success import dev_subset

    console = Console()
    workdir = args.workdir
    if args.fresh:
        for sub in ("sft", "rollouts", f"oracle-{config.oracle.split}.jsonl", "refresh-tasks.jsonl", "oracle-refresh-tasks.jsonl",
                    "demo_summary.json"):
            path = os.path.join(workdir, sub)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    t0 = time.perf_counter()
    split = args.split or str(config.rollout.split)
    if split == str(config.oracle.split):
        raise UserError(f"held-out split {split!r} is the split the demonstrations come from; pick another with --split")
    n_seen = int(args.eval_tasks if args.eval_tasks is not None else config.demo.eval_seen)
    n_held = int(args.eval_held_out if args.eval_held_out is not None else config.demo.eval_held_out)
    starter_arg = str(config.demo.starter) if args.starter is None else args.starter
    starter_dir = find_starter(starter_arg)
    if starter_arg and starter_dir is None and args.starter is not None:
        raise UserError(f"--starter {starter_arg}: no config.json there")
    starter = load_starter(starter_dir) if starter_dir else None

    console.rule("[bold]1. starting point")
    if starter is not None:
        apply_starter(config, starter)
        sheet = starter.datasheet
        console.print(f"starter planner {starter_dir}: {sheet.get('train', {}).get('steps', '?')} SFT steps on "
                      f"{sheet.get('data', {}).get('episodes', '?')} train-split oracle episodes, context "
                      f"{config.context.format}/{config.context.reasoning} (datasheet.json)")
    else:
        console.print("no starter planner: training from scratch (expect ~0% success after minutes of CPU SFT; DESIGN section 9)")
    tok = tokenizer.tokenizer_for_config(config, workdir)
    if tok.vocab_size > int(config.model.vocab_size):
        raise UserError(f"tokenizer has {tok.vocab_size} ids, more than config.model.vocab_size={config.model.vocab_size}")
    tasks = dev_subset(split, n_seen, n_held, seed=int(config.tasks.seed))
    console.print(f"evaluation: {len(tasks)} {split} tasks ({n_seen} of templates seen in training, {n_held} of held-out templates), greedy")

    rollouts_dir = os.path.join(workdir, "rollouts")
    results: dict[str, dict[str, Any]] = {}
    untrained_config = config.copy_and_resolve_references()
    untrained_config.model.init_from = ""
    console.rule("[bold]2. untrained model (random weights)")
    results["untrained"] = evaluate(untrained_config, None, tasks, os.path.join(rollouts_dir, "untrained.jsonl"), "untrained", tok)
    if starter is not None:
        console.rule("[bold]3. the starter planner")
        results["starter"] = evaluate(config, starter_dir, tasks, os.path.join(rollouts_dir, "starter.jsonl"), "starter", tok)

    console.rule("[bold]4. SFT refresh" if starter is not None else "[bold]4. SFT: planning cold start")
    result = sft_refresh(config, workdir, starter=starter is not None)
    console.print(f"SFT: {result.steps} steps, train loss {result.train_loss:.3f}, held-out loss "
                  f"{result.eval_loss if result.eval_loss is None else round(result.eval_loss, 3)}, "
                  f"unigram baseline {result.unigram_loss:.3f}; exported to {result.export_dir}")
    label = "starter+SFT" if starter is not None else "SFT"
    console.rule(f"[bold]5. {label} on the same tasks")
    results[label] = evaluate(config, result.export_dir, tasks, os.path.join(rollouts_dir, "sft.jsonl"), label, tok)

    report = {
        "split": split,
        "tasks": len(tasks),
        "tasks_seen_templates": n_seen,
        "tasks_held_out_templates": n_held,
        "starter": starter_dir,
        "columns": list(results),
        "results": {k: {**_row(v), "metrics": v["metrics"]} for k, v in results.items()},
        # the earlier keys, kept for readers of demo_summary.json
        "untrained": _row(results["untrained"]),
        "sft": _row(results[label]),
        "sft_train_loss": result.train_loss,
        "sft_eval_loss": result.eval_loss,
        "unigram_loss": result.unigram_loss,
        "export_dir": result.export_dir,
        "wall_s": time.perf_counter() - t0,
    }
    with open(os.path.join(workdir, "demo_summary.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    console.rule(f"[bold]greedy success on the same {len(tasks)} {split} tasks: " + " vs ".join(results))
    console.print(format_comparison(results), highlight=False)
    width = max(len(k) for k in results)
    console.print(f"{'':>{width}}  seen templates  held-out templates")
    for name, s in results.items():
        console.print(f"{name:>{width}}  {_pct(s['metrics'], 'success_seen'):>14}  {_pct(s['metrics'], 'success_held_out'):>18}")
    for name, row in report["results"].items():
        outcomes = row["tool_call_outcomes"]
        calls = sum(outcomes.values())
        errors = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]) if k != "ok")
        console.print(f"{name:>{width}}: {row['mean_output_tokens']:.1f} output tokens and {row['mean_tool_calls']:.2f} tool calls per task;"
                      f" {outcomes.get('ok', 0)}/{calls} calls executed" + (f" (errors: {errors})" if errors else ""))
    console.print(f"run directory: {workdir}  ({report['wall_s']:.0f} s)")
    return 0
