"""A world-general refresh: SFT of a checkpoint on oracle demonstrations of the train templates set in persona
worlds of no split (issue 28).

The shipped starter learned the train split's six persona worlds (its people, contacts, places); the dev and
test splits are set in worlds of their own, and that shift, not the templates, is where most of its dev
failures are (`bench/world_shift.py`, docs/experiments.md). A short refresh on the same templates in many
fresh worlds teaches the planner to read the world from its tools instead of remembering it.
"""
from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Sequence

REFRESH_SEED_BASE = 9_700_000  # instance seeds: above the RL draws (5,000,000 + 100,000 x seed + drawn) and the probes'
REFRESH_WORLD_OFFSET = 5_000  # worlds FRESH_PERSONA_BASE + this and up: none RL's rl.select_worlds or the probes draw


def fresh_instances(templates: Sequence[Any], worlds: Sequence[int] | None, *, k: int = 1, seed_base: int = REFRESH_SEED_BASE,
                    tries: int = 50) -> list[Any]:
    """Up to `k` gated instances of each template set in `worlds` (None: the train split's), from instance seed
    `seed_base` on, within `tries` x k draws per template."""
    from mpa_jax.envs.benchmark import build_task
    from mpa_jax.envs.gate import check_task
    from mpa_jax.envs.sandbox import SandboxEnv

    env, out = SandboxEnv(), []
    try:
        for t in templates:
            got = 0
            for inst in range(seed_base, seed_base + tries * k):
                task = build_task(t, "train", inst, personas=worlds)
                if task is not None and check_task(task, env) is None:
                    out.append(task)
                    got += 1
                    if got == k:
                        break
    finally:
        env.close()
    return out


def refresh_worlds(worlds: int) -> tuple[int, ...] | None:
    """The refresh's `worlds` persona worlds of no split (0: None, the train split's six)."""
    from mpa_jax.envs.benchmark import FRESH_PERSONA_BASE

    base = FRESH_PERSONA_BASE + REFRESH_WORLD_OFFSET
    return tuple(range(base, base + worlds)) if worlds else None


def world_refresh(config: Any, checkpoint: str, out: str, *, worlds: int, per_template: int, steps: int, lr: float,
                  templates: Sequence[Any] | None = None, progress: bool = False) -> tuple[str, dict[str, Any]]:
    """SFT `checkpoint` (an HF dir) for `steps` steps at AdamW `lr` on oracle demonstrations of `per_template`
    instances of every train template (or of `templates`) set in `worlds` worlds of no split (0: the train
    split's); the export (an HF dir with the checkpoint's tokenizer) and a summary (`<out>/refresh.json`).
    Resumes: the tasks, the demonstrations and SFT's checkpoints are kept, and a finished refresh is reused."""
    from mpa_jax.data import oracle_dataset
    from mpa_jax.envs.benchmark import templates_for
    from mpa_jax.envs.contract import write_jsonl
    from mpa_jax.sft import run_sft

    if steps < 1 or per_template < 1 or worlds < 0:
        raise ValueError(f"a world refresh needs steps >= 1, per_template >= 1 and worlds >= 0, got {steps}, {per_template}, {worlds}")
    reasoning = str(config.context.reasoning)  # the demonstrations' <think> sentences (configs/starter.py: none)
    done = os.path.join(out, "refresh.json")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
            summary = json.load(f)
        if (summary["worlds"], summary["per_template"], summary["steps"], summary["lr"], summary.get("reasoning", "none")) != (
                worlds, per_template, steps, lr, reasoning):
            raise ValueError(f"{out} holds a refresh of other settings ({summary}); use another directory")
        return summary["export_dir"], summary
    os.makedirs(out, exist_ok=True)
    tasks_path = os.path.join(out, "tasks.jsonl")
    if not os.path.exists(tasks_path):
        write_jsonl(tasks_path, fresh_instances(templates_for("train") if templates is None else templates, refresh_worlds(worlds), k=per_template, tries=40))
    c = copy.deepcopy(config)
    c.model.init_from = c.tokenizer.path = checkpoint  # the checkpoint's tokenizer, for the demonstrations too
    demos = os.path.join(out, "oracle-tasks.jsonl")
    if not os.path.exists(demos):  # written whole or not at all: an interrupted collection is redone, not half-used
        os.replace(oracle_dataset(c, out, split=tasks_path, max_tasks=0, out=demos + ".part", progress=progress)[0], demos)
    data = demos
    c.sft.steps, c.sft.lr, c.sft.warmup_steps = steps, lr, min(10, max(1, steps // 10))
    c.sft.export, c.sft.export_dtype = True, "float32"
    res = run_sft(c, os.path.join(out, "sft"), data, export=True, progress=progress)  # resumes from its last checkpoint
    loss = res.train_loss
    if not math.isfinite(loss):  # resumed at its last step: nothing trained in this call; its last logged loss
        from mpa_jax.train.metrics import read_metrics

        loss = next((float(r["train/loss"]) for r in reversed(read_metrics(res.metrics_path)) if "train/loss" in r), loss)
    with open(tasks_path, encoding="utf-8") as f:
        n = sum(1 for line in f if line.strip())
    summary = {"export_dir": res.export_dir, "tasks": n, "worlds": worlds, "per_template": per_template, "steps": steps, "lr": lr,
               "reasoning": reasoning, "train_loss": float(loss)}
    with open(done, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return res.export_dir, summary
