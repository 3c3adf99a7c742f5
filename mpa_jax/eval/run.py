"""`evaluate`: one checkpoint on a held-out split, k runs per task, with and/or without the harness.

Writes `<out_dir>/eval.json` and the rollouts under `<out_dir>/<harness mode>/run<i>.jsonl`. A run
whose summary file exists is reused, so an interrupted evaluation continues where it stopped.
k = 1 is one greedy run; k > 1 are k sampled runs (config.rollout.temperature, seeds seed..seed+k-1).
"""
from __future__ import annotations

import collections
import copy
import importlib.util
import json
import os
import time
from typing import Any, Sequence

from mpa_jax.eval.metrics import PriceTable, eval_metrics

HARNESS_MODES = ("off", "on", "both")


class HarnessUnavailable(RuntimeError):
    """`--harness on|both` asked for a harness runtime this build does not have yet."""


def harness_available(config: Any = None) -> tuple[bool, str]:
    """Whether the agent loop can run through the harness runtime (issue 14), and why not.

    The seam is `config.harness.enabled`: `run_rollouts` then puts the harness session between the
    planner and the env."""
    if importlib.util.find_spec("mpa_jax.harness.runtime") is None:
        return False, "the harness runtime (mpa_jax.harness.runtime, issue 14) is not in this build"
    if config is not None and "enabled" not in config.get("harness", {}):
        return False, "the config has no harness section (config.harness.enabled)"
    return True, ""


def with_harness(config: Any, on: bool, version_dir: str = "") -> Any:
    """A copy of `config` with the harness on or off (and running under `version_dir` when given)."""
    cfg = copy.deepcopy(config)
    if "harness" in cfg and "enabled" in cfg.harness:
        cfg.harness.enabled = bool(on)
        if on and version_dir:
            cfg.harness.version_dir = version_dir
    elif on:
        raise HarnessUnavailable("the config has no harness section (config.harness.enabled)")
    return cfg


def heldout_tasks(split: str, n: int, *, seed: int = 0, per_template: int = 0) -> list[Any]:
    """`n` tasks of `split` spread evenly over (category, domain) cells, deterministically (0 = all)."""
    from mpa_jax.envs import load_tasks

    tasks = load_tasks(split, seed=seed, per_template=per_template)
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    cells: dict[tuple[str, str], list[Any]] = collections.defaultdict(list)
    for t in tasks:
        cells[(t.category, t.domain)].append(t)
    # interleave the categories so that a small n still sees every category
    by_cat: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for key in sorted(cells):
        by_cat[key[0]].append(key)
    order: list[tuple[str, str]] = []
    cat_lists = [by_cat[c] for c in sorted(by_cat)]
    for i in range(max(len(v) for v in cat_lists)):
        order += [v[i] for v in cat_lists if i < len(v)]
    out: list[Any] = []
    depth = 0
    while len(out) < n:
        for key in order:
            if depth < len(cells[key]) and len(out) < n:
                out.append(cells[key][depth])
        depth += 1
    return out


def _modes(harness: str) -> list[str]:
    if harness not in HARNESS_MODES:
        raise ValueError(f"--harness must be one of {', '.join(HARNESS_MODES)}, got {harness!r}")
    return ["off", "on"] if harness == "both" else [harness]


def evaluate(
    config: Any,
    checkpoint: str | None,
    *,
    out_dir: str,
    split: str | None = None,
    harness: str = "off",
    k: int | None = None,
    tasks: Sequence[Any] | None = None,
    max_tasks: int | None = None,
    workdir: str | None = None,
    label: str = "eval",
    engine: Any = None,
    tokenizer: Any = None,
    progress: bool = True,
    harness_version_dir: str = "",
) -> dict[str, Any]:
    """Evaluate `checkpoint` (an HF directory, or None: the config's untrained model); write eval.json.

    `harness_version_dir`: an approved harness version to run "on" under (default: the config's)."""
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.rollout import run as rollout_run

    ev = config.eval
    split = split or str(ev.split)
    k = int(ev.k if k is None else k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    modes = _modes(harness)
    if "on" in modes:
        ok, why = harness_available(config)
        if not ok:
            raise HarnessUnavailable(f"--harness {harness}: {why}; use --harness off")
    if tasks is None:
        tasks = heldout_tasks(split, int(ev.max_tasks if max_tasks is None else max_tasks), seed=int(config.tasks.seed),
                              per_template=int(config.tasks.per_template))
    tasks = list(tasks)
    if not tasks:
        raise ValueError(f"no tasks to evaluate in split {split!r}")
    os.makedirs(out_dir, exist_ok=True)
    prices = PriceTable.from_config(ev.prices)
    t0 = time.perf_counter()
    if tokenizer is None:
        tokenizer = rollout_run.load_rollout_tokenizer(config, checkpoint, workdir or out_dir)
    if engine is None:
        engine = rollout_run.make_engine(config, checkpoint, tokenizer=tokenizer)
    results: dict[str, Any] = {}
    for mode in modes:
        trajs: list[Any] = []
        for i in range(k):
            path = os.path.join(out_dir, mode, f"run{i}.jsonl")
            summary_path = path[:-6] + ".summary.json"
            if not os.path.exists(summary_path):  # the summary is written after the rollouts: a complete run
                cfg = with_harness(config, mode == "on", harness_version_dir) if mode == "on" or "harness" in config else config
                rollout_run.run_rollouts(cfg, engine, tasks=tasks, out_path=path, tokenizer=tokenizer,
                                         greedy=(k == 1), seed=int(config.seed) + i, label=f"{label}/{mode}/{i}",
                                         progress=progress)
            trajs += read_jsonl(path, Trajectory)
        results[mode] = eval_metrics(trajs, k=k, prices=prices)
    report: dict[str, Any] = {
        "checkpoint": os.path.abspath(checkpoint) if checkpoint else None,
        "weight_version": str(getattr(engine, "weight_version", "")),
        "split": split, "tasks": len(tasks), "k": k, "greedy": k == 1,
        "harness": results,
        "wall_s": time.perf_counter() - t0,
    }
    if len(modes) == 2:
        report["harness_delta_success"] = results["on"]["overall"]["success"] - results["off"]["overall"]["success"]
    with open(os.path.join(out_dir, "eval.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    os.replace(os.path.join(out_dir, "eval.json.tmp"), os.path.join(out_dir, "eval.json"))
    return report


def format_eval(report: dict[str, Any]) -> str:
    """The eval.json as a short table: overall and per category per harness mode, then costs."""
    k = report["k"]
    lines = []
    for mode, m in report["harness"].items():
        o = m["overall"]
        cur = m["prices"]["currency"]
        lines.append(f"harness {mode}: {report['tasks']} {report['split']} tasks, k={k}, infra failures {m['infra_failures']}")
        lines.append(f"  {'':<12}{'success':>9}{'partial':>9}{'pass@1':>8}{f'pass^{k}':>8}{'out tok':>9}{'calls':>7}")
        for name, b in [("Overall", o)] + list(m["by_category"].items()):
            lines.append(f"  {name:<12}{100 * b['success']:8.1f}%{b['partial_score']:9.3f}{100 * b['pass@1']:7.1f}%"
                         f"{100 * b[f'pass^{k}']:7.1f}%{b['mean_output_tokens']:9.1f}{b['mean_tool_calls']:7.2f}")
        c = o["cost_per_1k_tasks"]
        lines.append(f"  cost per 1,000 tasks: {c['total']:.4f} {cur} (input {c['input_tokens']:.4f}, output {c['output_tokens']:.4f},"
                     f" tool calls {c['tool_calls']:.4f}, device {c['device_seconds']:.4f}); output tokens only (the seed's"
                     f" figure): {o['cost_per_1k_tasks_output_only']:.4f} {cur}")
    if "harness_delta_success" in report:
        lines.append(f"harness on - off: {100 * report['harness_delta_success']:+.1f} pts")
    return "\n".join(lines)
