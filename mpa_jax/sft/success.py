"""Task success during SFT: greedy rollouts of the current parameters on a fixed dev subset.

`success_eval(config, tasks, tokenizer)` returns an `on_eval(step, params)` hook for `run_sft`: at each
eval point it builds the embedded engine from the training parameters (no export, no disk), runs the
agent loop on `tasks` and returns success overall, on templates seen in training and on held-out
templates, and by category, so that one `mpa sft --eval-success N` run gives the learning curve
(success against steps, tokens and wall time: the train records carry tokens and time).

With `samples=n` the hook also runs n sampled rollouts per task (temperature from
`config.rollout.temperature` unless given) and reports the unbiased pass@k (1 - C(n-c,k)/C(n,k), c of n
runs succeeded; `mpa_jax.eval.metrics.pass_at_k`) for every k in `ks`, overall, on seen / held-out
templates and by category, next to greedy (`pass_at_k_metrics`). The same evaluation of an exported
checkpoint, as one command:

    python -m mpa_jax.sft.success --checkpoint starter --config configs/starter.py --seen 32 --held-out 16 \
        --samples 8 --k 1 4 8 --temperature 1.0 0.7 --out runs/passk

prints a markdown table (greedy, then pass@k per temperature) and writes `<out>/passk.json`.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence


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


def pass_at_k_metrics(trajectories: Iterable[Any], tasks: Sequence[Any], ks: Sequence[int]) -> dict[str, float]:
    """Unbiased pass@k from n sampled runs per task (every task of `tasks` needs >= max(ks) scored runs):
    `pass@<k>` overall, `pass@<k>_seen` / `pass@<k>_held_out` (templates seen in training or not) and
    `pass@<k>_<category>`, each the mean over tasks of 1 - C(n-c,k)/C(n,k); plus `samples` (the smallest n).
    Infra failures are excluded (not the policy's failure), as in `mpa eval`."""
    from mpa_jax.eval.metrics import pass_at_k

    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"pass@k needs k >= 1, got {ks}")
    runs: dict[str, list[bool]] = collections.defaultdict(list)
    for t in trajectories:
        if t.infra_failure or t.verification is None or t.verification.infra_error:
            continue
        runs[t.task_id].append(bool(t.verification.success))
    ho = held_out_templates()
    groups: dict[str, list[Any]] = collections.defaultdict(list)
    n_min = None
    for task in tasks:
        r = runs.get(task.id, [])
        if len(r) < max(ks):
            raise ValueError(f"task {task.id}: {len(r)} scored runs, fewer than k={max(ks)} (raise the samples per task)")
        n_min = len(r) if n_min is None else min(n_min, len(r))
        for g in ("", "_held_out" if task.template in ho else "_seen", f"_{task.category}"):
            groups[g].append(r)
    out: dict[str, float] = {"samples": float(n_min or 0)}
    for g, rs in groups.items():
        for k in ks:
            out[f"pass@{k}{g}"] = sum(pass_at_k(len(r), sum(r), k) for r in rs) / len(rs)
    return out


def sampled_runs(config: Any, engine: Any, tasks: Sequence[Any], tokenizer: Any, samples: int, out_path: str,
                 temperature: float | None = None, seed: int = 0, label: str = "sampled") -> str:
    """`samples` sampled rollouts of every task (one batch: each task repeated, every episode its own
    sampling seed) at `temperature` (default `config.rollout.temperature`); trajectories -> `out_path`."""
    from mpa_jax.rollout.run import run_rollouts

    if samples < 1:
        raise ValueError(f"samples per task must be >= 1, got {samples}")
    cfg = config
    if temperature is not None:
        if float(temperature) <= 0:
            raise ValueError(f"sampled pass@k needs a temperature > 0, got {temperature} (greedy is the k=1 column)")
        cfg = copy.deepcopy(config)
        cfg.rollout.temperature = float(temperature)
    repeated = [t for t in tasks for _ in range(samples)]
    run_rollouts(cfg, engine, tasks=repeated, out_path=out_path, tokenizer=tokenizer, greedy=False, seed=seed,
                 label=label, progress=False)
    return out_path


def pass_ks(samples: int, ks: Sequence[int] = ()) -> tuple[int, ...]:
    """The k values of pass@k for `samples` runs per task (default 1 and `samples`); ValueError when a k is
    not in 1..samples."""
    ks = tuple(int(k) for k in ks) or ((1, samples) if samples > 1 else (1,))
    if min(ks) < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={min(ks)}")
    if samples and max(ks) > samples:
        raise ValueError(f"pass@k with k={max(ks)} needs at least {max(ks)} samples per task, got {samples}")
    return ks


def success_eval(config: Any, tasks: Sequence[Any], tokenizer: Any, out_dir: str,
                 log: Callable[[str], None] | None = None, samples: int = 0, ks: Sequence[int] = (),
                 temperature: float | None = None) -> Callable[[int, Any], dict[str, float]]:
    """An `on_eval(step, params)` hook: greedy rollouts of `params` on `tasks`, trajectories kept under
    `out_dir/step_<n>.jsonl`; returns the success metrics (see `success_metrics`). With `samples` > 0, also
    that many sampled runs per task (`out_dir/step_<n>.sampled.jsonl`) and pass@k for k in `ks` (default:
    1 and `samples`; see `pass_at_k_metrics`)."""
    ks = pass_ks(samples, ks)
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
        if samples:
            from mpa_jax.envs import Trajectory, read_jsonl

            spath = sampled_runs(config, engine, tasks, tokenizer, samples, os.path.join(out_dir, f"step_{step}.sampled.jsonl"),
                                 temperature, seed=int(config.seed), label=f"sft-{step}-sampled")
            out.update(pass_at_k_metrics(read_jsonl(spath, Trajectory), tasks, ks))
        out["success_wall_s"] = time.perf_counter() - t0
        if log is not None:
            passk = "".join(f", pass@{k} {100 * out[f'pass@{k}']:.1f}%" for k in ks) if samples else ""
            log(f"step {step}: success {100 * out['success']:.1f}% (seen {100 * out.get('success_seen', 0):.1f}%,"
                f" held-out {100 * out.get('success_held_out', 0):.1f}%){passk} on {len(tasks)} tasks")
        return out

    return on_eval


CATEGORIES = ("tool_use", "memory", "skills", "subagent")


def evaluate_checkpoint(config: Any, checkpoint: str, out_dir: str, *, n_seen: int, n_held_out: int, samples: int,
                        ks: Sequence[int], temperatures: Sequence[float], split: str = "dev") -> dict[str, Any]:
    """Greedy success and sampled pass@k (per temperature) of an exported checkpoint on the same
    `dev_subset`; writes and returns `<out_dir>/passk.json` (rollouts beside it)."""
    from mpa_jax.envs import Trajectory, context, read_jsonl
    from mpa_jax.rollout.run import load_rollout_tokenizer, make_engine, run_rollouts

    sheet_path = os.path.join(checkpoint, "datasheet.json")
    if os.path.isfile(sheet_path):  # the checkpoint's context format travels in its datasheet (as in the demo)
        with open(sheet_path, encoding="utf-8") as f:
            ctx = json.load(f).get("context", {})
        if ctx:
            config.context.format, config.context.reasoning = ctx["format"], ctx["reasoning"]
    context.configure(config)
    tasks = dev_subset(split, n_seen, n_held_out, seed=int(config.tasks.seed))
    os.makedirs(out_dir, exist_ok=True)
    tok = load_rollout_tokenizer(config, checkpoint, out_dir)
    engine = make_engine(config, checkpoint, tokenizer=tok)
    t0 = time.perf_counter()
    path = os.path.join(out_dir, "greedy.jsonl")
    summary = run_rollouts(config, engine, tasks=tasks, out_path=path, tokenizer=tok, greedy=True, label="greedy", progress=False)
    greedy = success_metrics(summary, path, tasks)
    greedy["wall_s"] = time.perf_counter() - t0
    sampled = {}
    for temp in temperatures:
        t0 = time.perf_counter()
        spath = sampled_runs(config, engine, tasks, tok, samples, os.path.join(out_dir, f"sampled_T{temp:g}.jsonl"), temp,
                             seed=int(config.seed), label=f"T{temp:g}")
        sampled[f"{temp:g}"] = {**pass_at_k_metrics(read_jsonl(spath, Trajectory), tasks, ks), "wall_s": time.perf_counter() - t0}
    ho = held_out_templates()
    report = {"checkpoint": os.path.abspath(checkpoint), "split": split, "tasks": len(tasks),
              "tasks_seen": sum(t.template not in ho for t in tasks), "tasks_held_out": sum(t.template in ho for t in tasks),
              "tasks_by_category": dict(collections.Counter(t.category for t in tasks)),
              "context": f"{config.context.format}/{config.context.reasoning}", "samples": samples, "ks": list(ks),
              "greedy": greedy, "sampled": sampled}
    with open(os.path.join(out_dir, "passk.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    return report


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


def main(argv: list[str] | None = None) -> int:
    """`python -m mpa_jax.sft.success --checkpoint DIR ...`: greedy + sampled pass@k of an exported checkpoint."""
    p = argparse.ArgumentParser(description="Greedy success and sampled pass@k of an exported checkpoint on a dev subset")
    p.add_argument("--checkpoint", required=True, help="exported Hugging Face directory (e.g. starter)")
    p.add_argument("--config", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                                    "configs", "starter.py"))
    p.add_argument("--out", required=True, help="directory for the rollouts and passk.json")
    p.add_argument("--seen", type=int, default=32, help="dev tasks of templates seen in training")
    p.add_argument("--held-out", type=int, default=16, help="dev tasks of held-out templates")
    p.add_argument("--samples", type=int, default=8, help="sampled runs per task (n)")
    p.add_argument("--k", type=int, nargs="+", default=[1, 4, 8], help="k values of pass@k (each <= --samples)")
    p.add_argument("--temperature", type=float, nargs="+", default=None, help="sampling temperatures (default: config.rollout.temperature)")
    p.add_argument("--split", default="dev")
    a = p.parse_args(argv)
    from mpa_jax.config import load_config_file

    if not os.path.isdir(a.checkpoint):
        p.error(f"--checkpoint {a.checkpoint}: not a directory")
    if max(a.k) > a.samples or min(a.k) < 1:
        p.error(f"--k {a.k}: every k must be between 1 and --samples ({a.samples})")
    config = load_config_file(a.config)
    temps = a.temperature or [float(config.rollout.temperature)]
    if min(temps) <= 0:
        p.error(f"--temperature {temps}: must be > 0 (greedy is always reported)")
    report = evaluate_checkpoint(config, a.checkpoint, a.out, n_seen=a.seen, n_held_out=a.held_out, samples=a.samples,
                                 ks=a.k, temperatures=temps, split=a.split)
    print(format_passk(report))
    print(f"greedy {report['greedy']['wall_s']:.0f} s; " + "; ".join(f"T={t}: {m['wall_s']:.0f} s" for t, m in report["sampled"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
