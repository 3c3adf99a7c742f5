"""`mpa demo`: the short end-to-end path (`make demo` runs the closed loop, `mpa loop`).

Real runs start from a pretrained checkpoint; the CPU demo starts the same way, from the shipped starter
planner (`starter/`, built by `mpa starter` from configs/starter.py; DESIGN section 9). On the same tasks of the
pre-registered test set (docs/preregistered.md),
split into templates seen in training and held-out templates, it prints side by side:

    untrained (the starter's shape, random weights) | the starter | the starter after an SFT refresh

Without a starter directory the demo trains from scratch instead (untrained | SFT). Everything lands in
`<workdir>/demo_summary.json`. The stages are the run services: `eval.Evaluator`, `data.Collector`, `run_sft`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from typing import Any

from mpa_jax.cli import UserError
from mpa_jax.files import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "example: mpa demo --workdir runs/demo_short   (the untrained, starter and starter + SFT rows only; make demo runs the loop)"
    parser.add_argument("--split", default=None, help="held-out split to evaluate on (default: config.loop.eval_split, the loop's: tiny 'preregistered')")
    parser.add_argument("--eval-tasks", type=int, default=None,
                        help="tasks of templates seen in training per evaluation (default: config.demo.eval_seen)")
    parser.add_argument("--eval-held-out", type=int, default=None,
                        help="tasks of held-out templates per evaluation (default: config.demo.eval_held_out)")
    parser.add_argument("--checkpoint", "--starter", dest="starter", default=None, help="starter planner directory (default: config.demo.starter; '' = from scratch)")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory's earlier demo outputs first")


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


def sft_refresh(config: Any, workdir: str, *, starter: bool) -> Any:
    """Oracle demonstrations on the train split and SFT (from the starter when `starter`): the SFTResult.
    From a starter, the refresh's own schedule (`config.demo.refresh_*`) on a stratified train sample."""
    from mpa_jax.data import Collector, oracle_dataset
    from mpa_jax.envs import load_tasks, write_jsonl
    from mpa_jax.eval import stratified
    from mpa_jax.sft import run_sft
    from mpa_jax.tokenizer import tokenizer_for_config

    cfg = config.copy_and_resolve_references()
    if not starter:
        traj_path, _, _ = oracle_dataset(cfg, workdir)
        return run_sft(cfg, os.path.join(workdir, "sft"), traj_path, export=True)
    d = cfg.demo
    cfg.sft.steps, cfg.sft.lr, cfg.sft.warmup_steps = int(d.refresh_steps), float(d.refresh_lr), int(d.refresh_warmup)
    cfg.sft.batch_size = int(d.refresh_batch_size)
    # a sample spread over domains and categories (the split's head is a few templates of one domain)
    tasks = stratified(load_tasks(str(cfg.oracle.split), seed=int(cfg.tasks.seed), per_template=int(cfg.tasks.per_template)),
                       int(d.refresh_tasks))
    write_jsonl(os.path.join(workdir, "refresh-tasks.jsonl"), tasks)
    traj_path = os.path.join(workdir, "oracle-refresh-tasks.jsonl")
    Collector(cfg, tokenizer_for_config(cfg, workdir)).oracle(tasks, seed=int(cfg.seed), variants=int(cfg.oracle.variants),
                                                              out=traj_path)
    return run_sft(cfg, os.path.join(workdir, "sft"), traj_path, export=True)


def _pct(m: dict[str, Any], key: str) -> str:
    return f"{100 * m[key]:.1f}%" if key in m else "-"


def run(args: argparse.Namespace, config: Any) -> int:
    from rich.console import Console

    from mpa_jax import tokenizer
    from mpa_jax.eval import Evaluator, eval_metrics, evaluation_tasks, success_view
    from mpa_jax.sft.starter import StarterError, find_starter, load_starter, with_starter

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
    split = args.split or str(config.loop.eval_split) or str(config.eval.split)  # the loop's evaluation tasks
    if split == str(config.oracle.split):
        raise UserError(f"held-out split {split!r} is the split the demonstrations come from; pick another with --split")
    n_seen = int(args.eval_tasks if args.eval_tasks is not None else config.demo.eval_seen)
    n_held = int(args.eval_held_out if args.eval_held_out is not None else config.demo.eval_held_out)
    starter_arg = str(config.demo.starter) if args.starter is None else args.starter
    starter_dir = find_starter(starter_arg)
    if starter_arg and starter_dir is None and args.starter is not None:
        raise UserError(f"--checkpoint {starter_arg}: no config.json there")
    try:
        starter = load_starter(starter_dir) if starter_dir else None
    except StarterError as e:
        raise UserError(str(e)) from None

    console.rule("[bold]1. starting point")
    if starter is not None:
        config = with_starter(config, starter)
        sheet = starter.datasheet
        console.print(f"starter planner {starter_dir}: {sheet.get('train', {}).get('steps', '?')} SFT steps on "
                      f"{sheet.get('data', {}).get('episodes', '?')} train-split oracle episodes, context "
                      f"{config.context.format}/{config.context.reasoning} (datasheet.json)")
    else:
        console.print("no starter planner: training from scratch (expect ~0% success after minutes of CPU SFT; DESIGN section 9)")
    tok = tokenizer.tokenizer_for_config(config, workdir)
    if tok.vocab_size > int(config.model.vocab_size):
        raise UserError(f"tokenizer has {tok.vocab_size} ids, more than config.model.vocab_size={config.model.vocab_size}")
    tasks = evaluation_tasks(split, n_seen=n_seen, n_held_out=n_held, seed=int(config.tasks.seed))
    console.print(f"evaluation: {len(tasks)} {split} tasks ({n_seen} of templates seen in training, {n_held} of held-out templates), greedy")

    rollouts = os.path.join(workdir, "rollouts")
    results: dict[str, dict[str, Any]] = {}

    def evaluate(cfg: Any, checkpoint: str | None, name: str, label: str) -> None:
        ev = Evaluator(cfg, tasks, tokenizer=tok)
        path = os.path.join(rollouts, f"{name}.jsonl")
        m = eval_metrics(ev.run(ev.engine_for(checkpoint, workdir), path, greedy=True, label=label), prices=ev.prices)
        o = m["overall"]
        results[label] = {"success_rate": o["success"], "mean_score": o["partial_score"], "mean_output_tokens": o["mean_output_tokens"],
                          "mean_tool_calls": o["mean_tool_calls"], "by_category": {k: v["success"] for k, v in m["by_category"].items()},
                          "by_domain": {k: v["success"] for k, v in m["by_domain"].items()},
                          "tool_call_outcomes": tool_call_outcomes(path), "metrics": success_view(m)}

    untrained = config.copy_and_resolve_references()
    untrained.model.init_from = ""
    console.rule("[bold]2. untrained model (random weights)")
    evaluate(untrained, None, "untrained", "untrained")
    if starter is not None:
        console.rule("[bold]3. the starter planner")
        evaluate(config, starter_dir, "starter", "starter")
    console.rule("[bold]4. SFT refresh" if starter is not None else "[bold]4. SFT: planning cold start")
    result = sft_refresh(config, workdir, starter=starter is not None)
    console.print(f"SFT: {result.steps} steps, train loss {result.train_loss:.3f}, held-out loss "
                  f"{result.eval_loss if result.eval_loss is None else round(result.eval_loss, 3)}, "
                  f"unigram baseline {result.unigram_loss:.3f}; exported to {result.export_dir}")
    label = "starter+SFT" if starter is not None else "SFT"
    console.rule(f"[bold]5. {label} on the same tasks")
    evaluate(config, result.export_dir, "sft", label)

    report = {"split": split, "tasks": len(tasks), "tasks_seen_templates": n_seen, "tasks_held_out_templates": n_held,
              "starter": starter_dir, "columns": list(results), "results": results, "sft_train_loss": result.train_loss,
              "sft_eval_loss": result.eval_loss, "unigram_loss": result.unigram_loss, "export_dir": result.export_dir,
              "wall_s": time.perf_counter() - t0}
    write_json(os.path.join(workdir, "demo_summary.json"), report)
    width = max(len(k) for k in results)
    console.rule(f"[bold]greedy success on the same {len(tasks)} {split} tasks: " + " vs ".join(results))
    console.print(f"{'':>{width}}  {'all':>7}  seen templates  held-out templates", highlight=False)
    for name, row in results.items():
        m = row["metrics"]
        console.print(f"{name:>{width}}  {_pct(m, 'success'):>7}  {_pct(m, 'success_seen'):>14}  {_pct(m, 'success_held_out'):>18}",
                      highlight=False)
    for name, row in results.items():
        outcomes = row["tool_call_outcomes"]
        calls = sum(outcomes.values())
        errors = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]) if k != "ok")
        console.print(f"{name:>{width}}: {row['mean_output_tokens']:.1f} output tokens and {row['mean_tool_calls']:.2f} tool calls per task;"
                      f" {outcomes.get('ok', 0)}/{calls} calls executed" + (f" (errors: {errors})" if errors else ""))
    console.print(f"run directory: {workdir}  ({report['wall_s']:.0f} s)")
    return 0
