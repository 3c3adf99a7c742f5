"""`mpa oracle --split train --out FILE`: demonstrations from the scripted oracle planner.

Each task of the split is solved by the oracle in the sandbox (`envs.oracle.run_oracle_episode`), and
the chat is encoded with the chat template (`tokenizer.encode_chat`) into a Trajectory: token ids,
the assistant-only loss mask, logprobs 0.0 (no behaviour policy), steps, verification, messages and
provenance planner="oracle". No jax is imported here.
"""
from __future__ import annotations

import argparse
import collections
import os
import time
from typing import Any

from mpa_jax.envs.contract import Trajectory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", default=None, help="task split: train | dev | test, or a task JSONL (default: config.oracle.split)")
    parser.add_argument("--out", default=None, help="trajectory JSONL to write (default: <workdir>/oracle-<split>.jsonl)")
    parser.add_argument("--max-tasks", type=int, default=None, help="at most this many tasks (default: config.oracle.max_tasks; 0 = all)")
    add_env_arguments(parser)


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """`--env KIND` and `--device SERIAL` (shared by oracle and rollout)."""
    parser.add_argument("--env", default=None, choices=("sandbox", "adb"), help="env kind (default: config.envs.kind or sandbox)")
    parser.add_argument("--device", default=None, help="device serial for --env adb (default: config.envs.adb.device)")


def apply_env_arguments(args: argparse.Namespace, config: Any) -> str:
    """Fold --env/--device into the config (`config.envs.kind`, `config.envs.adb.device`); returns the kind."""
    from mpa_jax.cli import UserError

    kind = args.env or str(config.get("envs", {}).get("kind", "sandbox"))
    if "envs" in config:
        with config.unlocked():
            config.envs.kind = kind
        if args.device:
            config.envs.adb.device = args.device
    if kind == "simulated":
        raise UserError("simulated envs are for training only: the benchmark (oracle/rollout over task splits)"
                        " refuses simulated episodes")
    if kind == "adb" and not (args.device or ("envs" in config and str(config.envs.adb.device))):
        raise UserError("--env adb needs --device SERIAL (or config.envs.adb.device)")
    return kind


def _seed_for(base: int, task_index: int, variant: int) -> int:
    # distinct, reproducible episode seeds per (config seed, task, variant)
    return (base * 1_000_003 + task_index * 97 + variant) % (2**31)


def episode_to_trajectory(tok: Any, task: Any, episode: Any, seed: int, vocab_limit: int | None = None,
                          env_kind: str = "sandbox") -> Trajectory:
    """Encode one oracle episode as a Trajectory (token-in/token-out: the template renders the chat once)."""
    from mpa_jax.tokenizer import encode_chat

    ids, mask = encode_chat(tok, episode.messages, episode.tools)
    if vocab_limit is not None and ids and max(ids) >= vocab_limit:
        raise ValueError(f"token id {max(ids)} does not fit config.model.vocab_size={vocab_limit}")
    n_out = int(sum(mask))
    return Trajectory(
        task_id=task.id,
        tokens=list(ids),
        loss_mask=list(mask),
        logprobs=[0.0] * len(ids),
        steps=list(episode.steps),
        verification=episode.verification,
        costs={"output_tokens": float(n_out), "input_tokens": float(len(ids) - n_out),
               "tool_calls": float(sum(1 for s in episode.steps if s.action.kind == "tool_call"))},
        infra_failure=bool(episode.verification and episode.verification.infra_error),
        provenance={"task": task.id, "env": env_kind, "planner": "oracle", "weight_version": "", "harness_version": "",
                    "template": task.template, "domain": task.domain, "category": task.category, "seed": seed},
        messages=list(episode.messages),
        finish_reason="stop",
    )


def make_oracle_trajectories(
    config: Any,
    workdir: str,
    split: str | None = None,
    max_tasks: int | None = None,
    out: str | None = None,
    progress: bool = True,
) -> str:
    """Run the oracle over a split's tasks and write their Trajectories; returns the JSONL path.

    `config.oracle.variants` episodes per task (differently seeded phrasing and ordering). Prints a summary.
    """
    from mpa_jax.envs import load_tasks, make_env, run_oracle_episode
    from mpa_jax.envs.base import EnvUnavailable
    from mpa_jax.tokenizer import model_vocab_size, tokenizer_for_config

    split = split or str(config.oracle.split)
    max_tasks = int(config.oracle.max_tasks) if max_tasks is None else int(max_tasks)
    variants = max(1, int(config.oracle.get("variants", 1)))
    out = out or os.path.join(workdir, f"oracle-{os.path.basename(split).replace('.jsonl', '')}.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tok = tokenizer_for_config(config, workdir)  # checked against the model's embedding (init_from's when set)
    vocab = model_vocab_size(config)
    tasks = load_tasks(split, seed=int(config.tasks.seed), per_template=int(config.tasks.per_template))
    if max_tasks > 0:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise ValueError(f"split {split!r} has no tasks")

    kind = str(config.get("envs", {}).get("kind", "sandbox"))
    env = make_env(kind, config=config) if kind != "sandbox" else make_env("sandbox")
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    total = collections.Counter()
    t0 = time.perf_counter()
    tmp = out + ".tmp"
    bar = _bar(progress, len(tasks) * variants)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for i, task in enumerate(tasks):
                for v in range(variants):
                    seed = _seed_for(int(config.seed), i, v)
                    try:
                        episode = run_oracle_episode(env, task, seed=seed)
                    except EnvUnavailable as e:  # every remaining episode would fail the same way: stop the run
                        raise EnvUnavailable(f"{e}; stopped after {i} of {len(tasks)} tasks") from None
                    except Exception as e:  # noqa: BLE001 - a device lost at reset: the episode is infra, the run goes on
                        stats["infra"].update(episodes=1)
                        print(f"{task.id}: infra: {type(e).__name__}: {e}")
                        continue
                    traj = episode_to_trajectory(tok, task, episode, seed, vocab, kind)
                    f.write(traj.to_json() + "\n")
                    ok = bool(traj.verification and traj.verification.success)
                    for key in (task.category, "all"):
                        stats[key].update(episodes=1, success=int(ok), tokens=len(traj.tokens), loss_tokens=int(sum(traj.loss_mask)),
                                          tool_calls=int(traj.costs["tool_calls"]))
                    total.update(episodes=1)
                    if bar is not None:
                        bar[0].update(bar[1], advance=1)
        os.replace(tmp, out)  # a partial file is never mistaken for the result
    finally:
        if bar is not None:
            bar[0].stop()
        close = getattr(env, "close", None)
        if close:
            close()
    _print_summary(out, stats, time.perf_counter() - t0)
    return out


def _bar(enabled: bool, total: int):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    p = Progress(TextColumn("oracle"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    p.start()
    return p, p.add_task("oracle", total=total)


def _print_summary(out: str, stats: dict[str, collections.Counter], seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"oracle trajectories -> {out} ({seconds:.1f} s)")
    for col in ("category", "episodes", "success", "mean tokens", "mean loss tokens", "mean tool calls"):
        table.add_column(col, justify="right" if col != "category" else "left")
    for key in sorted(stats, key=lambda k: (k == "all", k)):
        s = stats[key]
        n = max(s["episodes"], 1)
        table.add_row(key, str(s["episodes"]), f"{100.0 * s['success'] / n:.1f}%", f"{s['tokens'] / n:.0f}",
                      f"{s['loss_tokens'] / n:.0f}", f"{s['tool_calls'] / n:.1f}")
    Console().print(table)


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError

    from mpa_jax.envs.base import EnvUnavailable

    apply_env_arguments(args, config)
    try:
        make_oracle_trajectories(config, args.workdir, args.split, args.max_tasks, args.out)
    except (ValueError, EnvUnavailable) as e:  # ContractError, tokenizer/vocab mismatch, empty split; a dead device
        raise UserError(str(e)) from None
    return 0
