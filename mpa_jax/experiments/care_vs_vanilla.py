"""The CARE-vs-vanilla experiment: both algorithms from one SFT checkpoint, same budget, several seeds.

    result = care_vs_vanilla(config, workdir, init=None, seeds=2)

The start is named as every command names one: `init` (an HF directory, a run directory or `starter`; the config
is fitted to it: `experiments/arms.py`), else the start the config names already (`mpa experiment --checkpoint`:
the CLI fitted it; or `config.model.init_from`). With neither, the starting checkpoint is made here: oracle
demonstrations of the train tasks of `config.rl.templates` -> `run_sft` -> an exported HF directory
(`<workdir>/sft/hf`), so that the policy starts with non-zero success on exactly the tasks RL trains on, and the
config is fitted to it. Each arm is a `run_rl` into `<workdir>/<algo>-s<seed>`, which carries the arm's resolved
config and card (a start itself); a seed fixes the task order and sampling seeds, so arms with the same
seed see the same tasks in the same order (a paired comparison); the arms differ in `rl.algo` only (the vanilla
arm keeps the config's lambda schedule, which it ignores, so that both keep the same groups: `rl/care.py`). Writes `summary.json`,
`care_vs_vanilla.png` (success and mean output tokens per step, mean over seeds with each seed
faint) and `table.md` (final-step values) into `workdir`.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Mapping, Sequence

import numpy as np

from mpa_jax.experiments.arms import arm_config, fitted, prepare_arm
from mpa_jax.files import write_json, write_text

ALGOS = ("care", "vanilla")


def make_sft_start(config: Any, workdir: str, progress: bool = True) -> str:
    """Oracle trajectories on the RL templates' train tasks + SFT + export; returns the HF directory."""
    from mpa_jax.data import oracle_dataset
    from mpa_jax.envs.contract import write_jsonl
    from mpa_jax.rl.tasks import split_tasks
    from mpa_jax.sft import run_sft

    sft_dir = os.path.join(workdir, "sft")
    hf = os.path.join(sft_dir, "hf")
    if os.path.isfile(os.path.join(hf, "config.json")):
        return hf
    os.makedirs(sft_dir, exist_ok=True)
    tasks_path = os.path.join(sft_dir, "rl-train-tasks.jsonl")
    write_jsonl(tasks_path, split_tasks(str(config.rl.split), str(config.rl.templates), config.tasks))
    data, _, _ = oracle_dataset(config, sft_dir, split=tasks_path, max_tasks=0, progress=progress)
    cfg = copy.deepcopy(config)
    cfg.sft.export, cfg.sft.export_dtype = True, "float32"
    result = run_sft(cfg, sft_dir, data, export=True, progress=progress)
    return result.export_dir


def care_vs_vanilla(config: Any, workdir: str, *, init: str | None = None, seeds: int = 2, algos: Sequence[str] = ALGOS,
                    progress: bool = True, recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run every (algo, seed) arm (resuming finished or interrupted ones) and summarise; see the module docstring.
    `recipe`: what ran it (`command`, `config_file`, `start`), for the arms' cards."""
    from mpa_jax.rl.trainer import run_rl

    if seeds < 1:
        raise ValueError(f"care-vs-vanilla needs at least one seed, got {seeds}")
    os.makedirs(workdir, exist_ok=True)
    config = fitted(config, init, workdir)
    if not str(config.model.init_from):
        config = fitted(config, make_sft_start(config, workdir, progress=progress), workdir)
    start = str(config.model.init_from)
    runs: dict[str, dict[int, list[dict[str, float]]]] = {a: {} for a in algos}
    base_seed = int(config.seed)
    for seed in range(base_seed, base_seed + seeds):
        for algo in algos:
            cfg = arm_config(config, algo, seed)
            run_dir = os.path.join(workdir, f"{algo}-s{seed}")
            prepare_arm(cfg, run_dir, recipe)
            run_rl(cfg, run_dir, progress=progress)
            from mpa_jax.train.metrics import read_metrics

            recs = {int(r["step"]): r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))}  # last record per step
            runs[algo][seed] = [recs[s] for s in sorted(recs)]
    summary = summarise(runs)
    summary.update(init=start, seeds=seeds, steps=int(config.rl.steps), tasks_per_step=int(config.rl.tasks_per_step),
                   group_size=int(config.rl.group_size), templates=str(config.rl.templates))
    write_json(os.path.join(workdir, "summary.json"), summary)
    plot(runs, os.path.join(workdir, "care_vs_vanilla.png"))
    write_text(os.path.join(workdir, "table.md"), table(summary) + "\n")
    summary["png"] = os.path.join(workdir, "care_vs_vanilla.png")
    return summary


def _series(records: list[dict[str, float]], key: str) -> np.ndarray:
    return np.asarray([float(r.get(key, float("nan"))) for r in records], np.float64)


def summarise(runs: dict[str, dict[int, list[dict[str, float]]]], last: int = 3) -> dict[str, Any]:
    """Per algo: mean over seeds of success / output tokens / tool calls at the final step and over the last
    `last` steps (less noisy), plus per-seed values."""
    out: dict[str, Any] = {"algos": {}}
    for algo, by_seed in runs.items():
        block: dict[str, Any] = {"seeds": {}}
        for key in ("rl/success", "rl/output_tokens", "rl/tool_calls"):
            finals = [float(_series(r, key)[-1]) for r in by_seed.values() if r]
            lasts = [float(np.nanmean(_series(r, key)[-last:])) for r in by_seed.values() if r]
            firsts = [float(_series(r, key)[0]) for r in by_seed.values() if r]
            name = key.split("/")[1]
            block[f"{name}_final"] = float(np.mean(finals)) if finals else float("nan")
            block[f"{name}_last{last}"] = float(np.mean(lasts)) if lasts else float("nan")
            block[f"{name}_first"] = float(np.mean(firsts)) if firsts else float("nan")
        for seed, recs in by_seed.items():
            block["seeds"][str(seed)] = {k: _series(recs, k).tolist() for k in ("rl/success", "rl/output_tokens", "rl/lambda", "rl/competence")}
        out["algos"][algo] = block
    return out


def table(summary: dict[str, Any]) -> str:
    """The final-step table (markdown)."""
    algos = summary["algos"]
    lines = ["| algo | success (first step) | success (final) | success (last 3) | output tokens (first) | output tokens (final) | output tokens (last 3) | tool calls (last 3) |",
             "|---|---|---|---|---|---|---|---|"]
    for a, b in algos.items():
        lines.append(f"| {a} | {b['success_first']:.3f} | {b['success_final']:.3f} | {b['success_last3']:.3f} | "
                     f"{b['output_tokens_first']:.1f} | {b['output_tokens_final']:.1f} | {b['output_tokens_last3']:.1f} | {b['tool_calls_last3']:.2f} |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, list[dict[str, float]]]], path: str) -> str:
    """Two panels: success and mean output tokens per RL step; per algo the seed mean (bold) and each seed (faint)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"care": "tab:blue", "vanilla": "tab:orange"}
    for ax, key, label in ((axes[0], "rl/success", "success (train rollouts)"), (axes[1], "rl/output_tokens", "mean output tokens / episode")):
        for algo, by_seed in runs.items():
            series = [_series(r, key) for r in by_seed.values() if r]
            if not series:
                continue
            n = min(len(s) for s in series)
            steps = np.arange(1, n + 1)
            for s in series:
                ax.plot(steps, s[:n], color=colors.get(algo), alpha=0.25, linewidth=1)
            ax.plot(steps, np.mean([s[:n] for s in series], axis=0), color=colors.get(algo), linewidth=2.2,
                    label=f"{algo} (mean of {len(series)} seeds)")
        ax.set_xlabel("RL step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
