"""Task success during SFT: greedy rollouts of the current parameters on a fixed dev subset.

`success_eval(config, tasks, tokenizer)` returns an `on_eval(step, params)` hook for `run_sft`: at each
eval point it builds the embedded engine from the training parameters (no export, no disk), runs the
agent loop on `tasks` and returns success overall, on templates seen in training and on held-out
templates, and by category, so that one `mpa sft --eval-success N` run gives the learning curve
(success against steps, tokens and wall time: the train records carry tokens and time).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence


def held_out_templates() -> set[str]:
    """Names of the templates the train split never uses."""
    from mpa_jax.envs.taskgen import TEMPLATES

    return {t.name for t in TEMPLATES if t.held_out}


def dev_subset(split: str, n_seen: int, n_held_out: int, seed: int = 0, per_template: int = 0) -> list[Any]:
    """`n_seen` tasks of `split` from templates seen in training and `n_held_out` from held-out templates,
    each spread over (domain, category) cells (the demo's stratified walk); deterministic."""
    from mpa_jax.commands.demo import stratified
    from mpa_jax.envs import load_tasks

    tasks = load_tasks(split, seed=seed, per_template=per_template)
    ho = held_out_templates()
    seen = [t for t in tasks if t.template not in ho]
    held = [t for t in tasks if t.template in ho]
    return stratified(seen, n_seen) + stratified(held, n_held_out)


def success_metrics(summary: Mapping[str, Any], trajectories_path: str | None, tasks: Sequence[Any]) -> dict[str, float]:
    """Success rates from a rollout summary and its trajectories: overall, seen/held-out templates, by category."""
    from mpa_jax.envs import Trajectory, read_jsonl

    out = {"success": float(summary["success_rate"]), "score": float(summary["mean_score"])}
    for cat, b in summary["by_category"].items():
        out[f"success_{cat}"] = float(b["success_rate"])
    if trajectories_path:
        ho = held_out_templates()
        template = {t.id: t.template for t in tasks}
        hits = {"seen": [0, 0], "held_out": [0, 0]}
        for traj in read_jsonl(trajectories_path, Trajectory):
            key = "held_out" if template.get(traj.task_id) in ho else "seen"
            hits[key][1] += 1
            hits[key][0] += int(bool(traj.verification and traj.verification.success))
        for key, (s, n) in hits.items():
            if n:
                out[f"success_{key}"] = s / n
    return out


def success_eval(config: Any, tasks: Sequence[Any], tokenizer: Any, out_dir: str,
                 log: Callable[[str], None] | None = None) -> Callable[[int, Any], dict[str, float]]:
    """An `on_eval(step, params)` hook: greedy rollouts of `params` on `tasks`, trajectories kept under
    `out_dir/step_<n>.jsonl`; returns the success metrics (see `success_metrics`)."""
    import jax

    from mpa_jax.rollout.jax_engine import JaxEngine
    from mpa_jax.rollout.run import engine_replicas, run_rollouts
    from mpa_jax.sft.trainer import _model_and_params_source

    cfg, _ = _model_and_params_source(config)

    def on_eval(step: int, params: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        host = jax.device_get(params)  # training params are sharded on the mesh; the engine places its own copies
        engine = JaxEngine(cfg, host, max_batch=int(config.rollout.batch_size), replicas=engine_replicas(config),
                           weight_version=f"sft-{step}", vocab_limit=tokenizer.vocab_size)
        path = os.path.join(out_dir, f"step_{step}.jsonl")
        summary = run_rollouts(config, engine, tasks=list(tasks), out_path=path, tokenizer=tokenizer, greedy=True,
                               label=f"sft-{step}", progress=False)
        out = success_metrics(summary, path, tasks)
        out["success_wall_s"] = time.perf_counter() - t0
        if log is not None:
            log(f"step {step}: success {100 * out['success']:.1f}% (seen {100 * out.get('success_seen', 0):.1f}%,"
                f" held-out {100 * out.get('success_held_out', 0):.1f}%) on {len(tasks)} tasks")
        return out

    return on_eval
