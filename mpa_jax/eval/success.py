"""Task success of live parameters and sampled pass@k: the SFT trainer's success hook and `mpa eval --samples`.

`success_eval(config, tasks, tokenizer, out_dir)` returns an `on_eval(step, params)` hook for `run_sft`: at
each eval point it builds the embedded engine from the training parameters (no export, no disk), runs the
tasks greedily through the `Evaluator` and returns the success figures (`eval.metrics.success_view`:
overall, on templates seen in training and on held-out templates, by category), so that one
`mpa sft --eval-success N` run gives the learning curve.

With `samples=n` it also runs the evaluator's sampled mode (`Evaluator.sample`: n rollouts per task) and
reports the unbiased pass@k for every k in `ks` (`eval.metrics.pass_at_k_metrics`). The same for an exported
checkpoint, as one command (`passk_report`: `Evaluator.evaluate` greedy, then k = n sampled per
temperature, each with its eval.json; passk.json is their summary):

    mpa eval --config configs/starter.py --checkpoint starter --seen 32 --held-out 16 --samples 8 --pass-k 1 4 8 \
        --temperature 1.0 0.7 --workdir runs/passk
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from mpa_jax.eval.evaluator import Evaluator, default_ks
from mpa_jax.eval.metrics import eval_metrics, pass_at_k_metrics, passk_view, success_view

CATEGORIES = ("tool_use", "memory", "skills", "subagent", "followup")


def pass_ks(samples: int, ks: Sequence[int] = ()) -> tuple[int, ...]:
    """The k values of pass@k for `samples` runs per task (default 1 and `samples`); ValueError when a k is
    not in 1..samples."""
    return default_ks(samples, ks)


def success_eval(config: Any, tasks: Sequence[Any], tokenizer: Any, out_dir: str,
                 log: Callable[[str], None] | None = None, samples: int = 0, ks: Sequence[int] = (),
                 temperature: float | None = None) -> Callable[[int, Any], dict[str, float]]:
    """An `on_eval(step, params)` hook: greedy rollouts of `params` on `tasks`, trajectories kept under
    `out_dir/step_<n>.jsonl`; returns `success_view` of their metrics. With `samples` > 0, also the sampled
    mode (`out_dir/step_<n>.sampled.jsonl`) and pass@k for k in `ks` (default 1 and `samples`)."""
    ks = pass_ks(samples, ks)
    from mpa_jax import models
    from mpa_jax.rollout.engines import make_engine

    cfg, _ = models.run_model_config(config)  # the model of config.model, or of the HF dir in model.init_from
    ev = Evaluator(config, tasks, tokenizer=tokenizer, progress=False)

    def on_eval(step: int, params: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        engine = make_engine(config, params=params, model_cfg=cfg, version=f"sft-{step}", tokenizer=tokenizer)
        with ev.runner() as runner:  # one runner (envs, pool, harness session) for the greedy and sampled runs
            trajs = ev.run(engine, os.path.join(out_dir, f"step_{step}.jsonl"), greedy=True, label=f"sft-{step}", runner=runner)
            out = success_view(eval_metrics(trajs))
            if samples:
                sampled = ev.sample(engine, os.path.join(out_dir, f"step_{step}.sampled.jsonl"), samples, temperature=temperature,
                                    seed=int(config.seed), label=f"sft-{step}-sampled", runner=runner)
                out.update(pass_at_k_metrics(sampled, tasks, ks))
        out["success_wall_s"] = time.perf_counter() - t0
        if log is not None:
            passk = "".join(f", pass@{k} {100 * out[f'pass@{k}']:.1f}%" for k in ks) if samples else ""
            log(f"step {step}: success {100 * out['success']:.1f}% (seen {100 * out.get('success_seen', 0):.1f}%,"
                f" held-out {100 * out.get('success_held_out', 0):.1f}%){passk} on {len(tasks)} tasks")
        return out

    return on_eval


def passk_report(ev: Evaluator, engine: Any, out_dir: str, *, samples: int, ks: Sequence[int],
                 temperatures: Sequence[float]) -> dict[str, Any]:
    """Greedy success and the sampled mode's pass@k (and pass^samples) per temperature of `engine` on `ev`'s
    tasks, through `Evaluator.evaluate` (each its eval.json under `out_dir/greedy`, `out_dir/T<t>`); the
    report `mpa eval --samples` prints and keeps as passk.json."""
    from mpa_jax.eval.tasks import held_out_templates

    mode = "on" if ev.config.harness.enabled else "off"
    greedy_rep = ev.evaluate(engine, out_dir=os.path.join(out_dir, "greedy"), k=1, harness=mode, label="greedy")
    greedy = {**success_view(greedy_rep["harness"][mode]), "wall_s": greedy_rep["wall_s"]}
    sampled = {}
    for temp in temperatures:
        rep = ev.evaluate(engine, out_dir=os.path.join(out_dir, f"T{temp:g}"), k=samples, ks=ks, temperature=temp,
                          harness=mode, label=f"T{temp:g}")
        m = rep["harness"][mode]
        sampled[f"{temp:g}"] = {**passk_view(m, samples=samples), f"pass^{samples}": m["overall"][f"pass^{samples}"],
                                "wall_s": rep["wall_s"]}
    ho = held_out_templates()
    cats: dict[str, int] = {}
    for t in ev.tasks:
        cats[t.category] = cats.get(t.category, 0) + 1
    return {"tasks": len(ev.tasks), "tasks_seen": sum(t.template not in ho for t in ev.tasks),
            "tasks_held_out": sum(t.template in ho for t in ev.tasks), "tasks_by_category": cats,
            "context": f"{ev.config.context.format}/{ev.config.context.reasoning}", "samples": samples, "ks": list(ks),
            "greedy": greedy, "sampled": sampled}


def format_passk(report: Mapping[str, Any]) -> str:
    """passk.json as a markdown table: greedy success, then pass@k per temperature; all / seen / held-out / categories."""
    cats = [c for c in CATEGORIES if c in report["tasks_by_category"]]
    n = report["tasks_by_category"]
    head = (f"| | all ({report['tasks']}) | seen templates ({report['tasks_seen']}) | held-out templates ({report['tasks_held_out']}) | "
            + " | ".join(f"{c} ({n[c]})" for c in cats) + " |")
    lines = [head, "|" + "---|" * (4 + len(cats))]

    def pct(m: Mapping[str, Any], key: str) -> str:
        return f"{100 * m[key]:.1f}%" if key in m else "-"

    g = report["greedy"]
    lines.append("| greedy success | " + " | ".join(pct(g, k) for k in ["success", "success_seen", "success_held_out"]
                                                     + [f"success_{c}" for c in cats]) + " |")
    for temp, m in report["sampled"].items():
        for k in report["ks"]:
            p = f"pass@{k}"
            lines.append(f"| {p}, T={temp} (n={report['samples']}) | " + " | ".join(
                pct(m, key) for key in [p, f"{p}_seen", f"{p}_held_out"] + [f"{p}_{c}" for c in cats]) + " |")
    return "\n".join(lines)
