"""`mpa experiment rl-lift`: can RL lift the planner on held-out tasks? A learning result that can fail.

    mpa experiment rl-lift --config configs/rl_lift.py --init starter --seeds 2 [--algos care,vanilla]

From one start (the shipped starter), each (algo, seed) arm runs `run_rl` with competence-aware selection
(`configs/rl_lift.py`) in segments of `--eval-every` steps; after each segment its checkpoint is exported and
evaluated greedily, harness off, on the same dev tasks (`--seen` of templates seen in training + `--held-out`
of held-out templates; 96 + 48 by default), and a row goes to `<arm>/curve.jsonl`: step, training episodes
so far, success overall / seen / held-out, mean output tokens and tool calls. Everything resumes: RL from
its last checkpoint (exact), evaluations from their eval.json. The start is evaluated once. At the end:
`summary.json`, `table.md` (start vs each arm's last point, seed means; CARE vs vanilla when both ran) and
`rl_lift.png` (success and output tokens against steps). Target (issue 28): +8 points over the start on the
144 tasks, and CARE within 2 points of vanilla at >= 25% fewer output tokens.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Sequence

import numpy as np


def _arm_config(config: Any, algo: str, seed: int) -> Any:
    cfg = copy.deepcopy(config)
    cfg.rl.algo, cfg.seed = algo, seed
    if algo == "vanilla":
        cfg.rl.lambda_max, cfg.rl.beta = 0.0, 0.0
    return cfg


def _read_curve(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def _point(report: dict[str, Any], step: int, episodes: float) -> dict[str, Any]:
    m = report["harness"]["off"]
    o, groups = m["overall"], m["by_templates"]
    return {"step": step, "episodes": episodes, "success": o["success"],
            "success_seen": groups.get("seen", {}).get("success"), "success_held_out": groups.get("held_out", {}).get("success"),
            "output_tokens": o["mean_output_tokens"], "tool_calls": o["mean_tool_calls"]}


def rl_lift(config: Any, workdir: str, *, init: str, seeds: int = 2, algos: Sequence[str] = ("care",), eval_every: int = 25,
            n_seen: int = 96, n_held_out: int = 48, progress: bool = True) -> dict[str, Any]:
    """Run every arm (resuming) and summarise; see the module docstring."""
    from mpa_jax.eval import Evaluator, select_tasks
    from mpa_jax.export import export_checkpoint
    from mpa_jax.rl.trainer import run_rl
    from mpa_jax.train.metrics import read_metrics

    if seeds < 1 or eval_every < 1:
        raise ValueError(f"rl-lift needs seeds >= 1 and --eval-every >= 1, got {seeds} and {eval_every}")
    os.makedirs(workdir, exist_ok=True)
    tasks = select_tasks("dev", n_seen=n_seen, n_held_out=n_held_out, seed=int(config.tasks.seed),
                         per_template=int(config.tasks.per_template))
    ev = Evaluator(config, tasks, progress=progress)
    start = _point(ev.evaluate(init, out_dir=os.path.join(workdir, "eval", "start"), label="start", workdir=workdir), 0, 0.0)
    steps = int(config.rl.steps)
    arms: dict[str, dict[int, list[dict[str, Any]]]] = {a: {} for a in algos}
    base = int(config.seed)
    for seed in range(base, base + seeds):
        for algo in algos:
            cfg = _arm_config(config, algo, seed)
            run_dir = os.path.join(workdir, f"{algo}-s{seed}")
            curve_path = os.path.join(run_dir, "curve.jsonl")
            curve = _read_curve(curve_path)
            done = {int(p["step"]) for p in curve}
            for stop in range(eval_every, steps + 1, eval_every):
                if stop in done:
                    continue
                res = run_rl(cfg, run_dir, init=init, max_steps=stop, progress=progress)
                hf = export_checkpoint(res.checkpoint_dir, os.path.join(run_dir, "hf", f"step_{stop}"), dtype="float32",
                                       tokenizer_dir=init)
                rep = ev.evaluate(hf, out_dir=os.path.join(run_dir, "eval", f"step_{stop}"), label=f"{algo}-s{seed}@{stop}", workdir=workdir)
                episodes = sum(float(r.get("rl/rollouts", 0.0)) for r in {int(r["step"]): r for r in read_metrics(res.metrics_path)}.values())
                point = _point(rep, stop, episodes)
                with open(curve_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(point, sort_keys=True) + "\n")
                curve.append(point)
            arms[algo][seed] = sorted(curve, key=lambda p: p["step"])
    summary = {"start": start, "tasks": len(tasks), "seen": n_seen, "held_out": n_held_out, "steps": steps, "eval_every": eval_every,
               "arms": {a: {str(s): c for s, c in by.items()} for a, by in arms.items()}}
    with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
        f.write(table(summary) + "\n")
    summary["png"] = plot(summary, os.path.join(workdir, "rl_lift.png"))
    return summary


def _mean(xs: list[Any]) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def table(summary: dict[str, Any]) -> str:
    """Start vs each arm's last evaluated point (seed means and per seed), in points of greedy success."""
    s = summary["start"]
    head = (f"| policy | step | all ({summary['tasks']}) | seen ({summary['seen']}) | held-out ({summary['held_out']}) | output tokens |"
            "\n|---|---|---|---|---|---|")
    rows = [f"| start | 0 | {100 * s['success']:.1f}% | {100 * s['success_seen']:.1f}% | {100 * s['success_held_out']:.1f}% |"
            f" {s['output_tokens']:.1f} |"]
    for algo, by in summary["arms"].items():
        lasts = [c[-1] for c in by.values() if c]
        for seed, c in by.items():
            if c:
                p = c[-1]
                rows.append(f"| {algo}, seed {seed} | {p['step']} | {100 * p['success']:.1f}% | {100 * (p['success_seen'] or 0):.1f}% |"
                            f" {100 * (p['success_held_out'] or 0):.1f}% | {p['output_tokens']:.1f} |")
        if len(lasts) > 1:
            rows.append(f"| **{algo}, mean of {len(lasts)} seeds** | {lasts[0]['step']} | {100 * _mean([p['success'] for p in lasts]):.1f}% |"
                        f" {100 * _mean([p['success_seen'] for p in lasts]):.1f}% | {100 * _mean([p['success_held_out'] for p in lasts]):.1f}% |"
                        f" {_mean([p['output_tokens'] for p in lasts]):.1f} |")
    return "\n".join([head] + rows)


def plot(summary: dict[str, Any], path: str) -> str:
    """Success (left) and mean output tokens (right) of the greedy evaluations against RL steps; start dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"care": "tab:blue", "vanilla": "tab:orange"}
    for ax, key, label in ((axes[0], "success", "greedy dev success (144 tasks)"), (axes[1], "output_tokens", "mean output tokens / episode")):
        ax.axhline(summary["start"][key], color="gray", linestyle="--", label="start")
        for algo, by in summary["arms"].items():
            for seed, c in by.items():
                if c:
                    ax.plot([0] + [p["step"] for p in c], [summary["start"][key]] + [p[key] for p in c], color=colors.get(algo), alpha=0.7,
                            marker="o", label=f"{algo} s{seed}")
        ax.set_xlabel("RL step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
