"""Config-driven entry points: build an engine from `config.rollout`, run the agent loop over a split.

    engine = make_engine(config, checkpoint=None)          # None: the config's model, randomly initialised
    summary = run_rollouts(config, engine_or_checkpoint, tasks=None, out_path="runs/x/rollouts.jsonl")

`run_rollouts` writes the Trajectories (one JSON per line) to `out_path` and the summary (success
overall, by domain and by category, infra failures, costs) to `<out_path without .jsonl>.summary.json`,
and returns the summary dict. `mpa rollout` and the demo call it.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

from mpa_jax.envs.contract import Task, write_jsonl
from mpa_jax.rollout.agent_loop import AgentLoopConfig, run_episodes, summarize
from mpa_jax.rollout.types import RolloutEngine, SamplingParams


class RolloutSetupError(ValueError):
    """A checkpoint, tokenizer or config does not fit the rollout; the message names it."""


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def make_engine(
    config: Any,
    checkpoint: str | None = None,
    *,
    mesh: Any = None,
    tokenizer: Any = None,
    vocab_limit: int | None = None,
) -> RolloutEngine:
    """The engine `config.rollout.engine` names ("jax" or "sglang").

    jax: `checkpoint` is an exported HF directory, or None for the config's model with random weights
    (seed `config.seed`; the untrained baseline). With `config.rollout.sharded`, parameters are placed
    on the mesh of `config.mesh`. sglang: a client for `config.rollout.sglang_url`; a `checkpoint`
    is loaded on the server through `/update_weights_from_disk`.

    The vocabulary rule: ids the tokenizer cannot produce are never sampled. Pass the `tokenizer`
    (its `vocab_size` becomes the engine's `vocab_limit`) or `vocab_limit` itself; a tokenizer larger
    than the model's embedding is a RolloutSetupError here. With neither, every id may be sampled.
    """
    if tokenizer is not None:
        tok_size = int(tokenizer.vocab_size)
        if vocab_limit is not None and int(vocab_limit) != tok_size:
            raise RolloutSetupError(f"make_engine: vocab_limit {vocab_limit} differs from the tokenizer's {tok_size} ids")
        vocab_limit = tok_size
    kind = str(config.rollout.engine)
    if checkpoint is not None and not os.path.isdir(checkpoint):
        raise RolloutSetupError(f"checkpoint {checkpoint} is not a directory")
    if checkpoint is not None and not _is_hf_dir(checkpoint):
        raise RolloutSetupError(
            f"checkpoint {checkpoint} is not an exported Hugging Face directory (no config.json); run `mpa export` on it first"
        )
    if kind == "sglang":
        from mpa_jax.rollout.sglang import engine_from_config

        engine = engine_from_config(config, vocab_limit=vocab_limit)
        if checkpoint is not None:
            engine.update_weights(os.path.abspath(checkpoint), os.path.basename(os.path.normpath(checkpoint)))
        return engine
    if kind != "jax":
        raise RolloutSetupError(f"config.rollout.engine must be 'jax' or 'sglang', got {kind!r}")
    import jax

    from mpa_jax import models
    from mpa_jax.rollout.jax_engine import JaxEngine, check_vocab_limit
    from mpa_jax.rollout.types import EngineError

    rules = None
    if mesh is None and bool(config.rollout.get("sharded", False)):
        from mpa_jax import sharding

        mesh = sharding.make_mesh(config.mesh)
        rules = sharding.rules_from_config(config)
    kw = dict(mesh=mesh, rules=rules, max_batch=int(config.rollout.batch_size), replicas=engine_replicas(config, mesh),
              vocab_limit=None if vocab_limit is None else int(vocab_limit))
    if checkpoint is not None:
        try:
            return JaxEngine.from_pretrained(checkpoint, dtype=str(config.model.param_dtype), **kw)
        except EngineError as e:
            raise RolloutSetupError(f"checkpoint {checkpoint}: {e}") from None
        except ValueError as e:  # hf_io.CheckpointError and config errors name the file or tensor
            raise RolloutSetupError(f"cannot load checkpoint {checkpoint}: {e}") from None
    cfg = models.config_from_ml(config.model)
    try:
        check_vocab_limit(kw["vocab_limit"], cfg.vocab_size)
    except EngineError as e:
        raise RolloutSetupError(f"config.model: {e}") from None
    params = models.init_params(cfg, jax.random.key(int(config.seed)), mesh=mesh, rules=rules)
    return JaxEngine(cfg, params, weight_version="init", **kw)


def check_engine_vocab(engine: Any, tokenizer: Any) -> None:
    """RolloutSetupError unless an engine samples exactly the tokenizer's ids (its `vocab_limit`).

    An engine without a `vocab_limit` attribute (a remote server) is not checked here; its client
    turns ids outside the tokenizer into an EngineError instead.
    """
    limit = getattr(engine, "vocab_limit", None)
    if limit is None:
        return
    size = int(tokenizer.vocab_size)
    model_vocab = getattr(getattr(engine, "cfg", None), "vocab_size", limit)
    if size > model_vocab:
        raise RolloutSetupError(
            f"tokenizer has {size} ids but the model's vocabulary is {model_vocab}; they must come from the same run"
        )
    if int(limit) != size:
        raise RolloutSetupError(
            f"the engine samples ids below {limit} but the tokenizer has {size}; build the engine with"
            f" vocab_limit={size} (make_engine(..., tokenizer=tok)) so that it never samples an id the tokenizer cannot decode"
        )


def engine_replicas(config: Any, mesh: Any = None) -> int:
    """Weight replicas of the embedded engine from `config.rollout.replicas`.

    0 (auto): on a CPU host one per core this process may run on, up to the XLA host devices
    (`--xla_force_host_platform_device_count`); 1 on accelerators (use `rollout.sharded` and the mesh
    there) and with a mesh. An explicit count must not exceed the local devices.
    """
    import jax

    n = int(config.rollout.get("replicas", 0))
    if mesh is not None:
        if n > 1:
            raise RolloutSetupError(f"config.rollout.replicas={n} cannot be combined with rollout.sharded (a mesh)")
        return 1
    if n < 0 or n > jax.local_device_count():
        raise RolloutSetupError(
            f"config.rollout.replicas={n}: must be 0 (auto) or 1..{jax.local_device_count()} (the local devices)"
        )
    if n:
        return n
    if jax.default_backend() != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(jax.local_device_count(), cores))


def load_rollout_tokenizer(config: Any, checkpoint: str | None, workdir: str | None) -> Any:
    """The checkpoint's own tokenizer when it carries one, else the config's (`tokenizer_for_config`)."""
    from mpa_jax import tokenizer as tk

    if checkpoint is not None and tk.is_tokenizer_dir(checkpoint):
        return tk.load_tokenizer(checkpoint)
    return tk.tokenizer_for_config(config, workdir or os.path.join("runs", str(config.get("name", "run"))))


def _load_tasks(config: Any, split: str | None, max_tasks: int | None) -> list[Task]:
    from mpa_jax.envs import load_tasks

    tasks = load_tasks(split or str(config.rollout.split))
    n = int(config.rollout.max_tasks) if max_tasks is None else int(max_tasks)
    return list(tasks[:n]) if n > 0 else list(tasks)


def run_rollouts(
    config: Any,
    engine_or_checkpoint: RolloutEngine | str | None = None,
    tasks: Sequence[Task] | None = None,
    out_path: str | None = None,
    *,
    workdir: str | None = None,
    tokenizer: Any = None,
    split: str | None = None,
    max_tasks: int | None = None,
    greedy: bool | None = None,
    seed: int | None = None,
    label: str = "",
    progress: bool = True,
) -> dict[str, Any]:
    """Run the agent loop over `tasks` (default: `config.rollout.split`, first `max_tasks`) and summarise.

    `engine_or_checkpoint`: an engine, an exported HF checkpoint directory, or None (the config's
    model, untrained). `greedy` (default `config.rollout.greedy_eval`) samples at temperature 0.
    Returns the summary dict (see `summarize`) plus `out_path`, `summary_path`, `weight_version`,
    `label`, `wall_s`.
    """
    checkpoint = engine_or_checkpoint if isinstance(engine_or_checkpoint, (str, os.PathLike)) else None
    if checkpoint is not None:
        checkpoint = os.fspath(checkpoint)
    if tokenizer is None:
        tokenizer = load_rollout_tokenizer(config, checkpoint, workdir)
    if checkpoint is None and engine_or_checkpoint is not None:
        engine = engine_or_checkpoint
        check_engine_vocab(engine, tokenizer)
    else:
        engine = make_engine(config, checkpoint, tokenizer=tokenizer)
    model_cfg = getattr(engine, "cfg", None)
    max_pos = getattr(model_cfg, "max_position_embeddings", None)
    if max_pos is not None and int(config.rollout.max_total_tokens) > max_pos:
        raise RolloutSetupError(
            f"config.rollout.max_total_tokens ({config.rollout.max_total_tokens}) exceeds the model's"
            f" max_position_embeddings ({max_pos})"
        )
    task_list = list(tasks) if tasks is not None else _load_tasks(config, split, max_tasks)
    if not task_list:
        raise RolloutSetupError("no tasks to roll out")
    greedy = bool(config.rollout.greedy_eval) if greedy is None else bool(greedy)
    loop_cfg = AgentLoopConfig.from_config(
        config.rollout, seed=int(config.seed if seed is None else seed), greedy=greedy,
        planner=label or (os.path.basename(os.path.normpath(checkpoint)) if checkpoint else "policy"),
        env_kind=str(config.get("envs", {}).get("kind", "sandbox")),
    )
    from mpa_jax.envs import make_env
    from mpa_jax.envs.pool import EnvPool, limits_from_config

    new_env = lambda kind: make_env(kind, config=config)  # noqa: E731
    session = None
    if bool(config.get("harness", {}).get("enabled", False)):
        # The harness presents itself to the loop as the env (DESIGN §5); off = raw planner + env.
        from mpa_jax.harness.planners import EnginePlanner
        from mpa_jax.harness.runtime import session_for_run

        session = session_for_run(config, env_kind=loop_cfg.env_kind,
                                  subplanner=EnginePlanner(engine, tokenizer, int(config.rollout.max_new_tokens), loop_cfg.temperature,
                                                           params_cls=SamplingParams))
        loop_cfg.harness_version = session.version_label
        new_env = lambda _kind: session.env_factory()  # noqa: E731
    t0 = time.perf_counter()
    try:
        # env kwargs (a device serial, a simulator backend) and the per-kind pool limits come from config.envs
        with EnvPool(limits_from_config(config) if "envs" in config else {}) as pool:
            trajectories = _run_with_progress(engine, tokenizer, task_list, new_env, loop_cfg, progress, label, pool,
                                              session.annotate if session is not None else None)
    finally:
        if session is not None:
            session.close()
    wall = time.perf_counter() - t0
    summary = summarize(trajectories)
    summary.update(label=label, weight_version=str(engine.weight_version), wall_s=wall, greedy=greedy)
    if out_path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        write_jsonl(out_path, trajectories)
        base = out_path[:-6] if out_path.endswith(".jsonl") else out_path
        summary_path = base + ".summary.json"
        summary.update(out_path=out_path, summary_path=summary_path)
        with open(summary_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    return summary


def _run_with_progress(engine: Any, tokenizer: Any, tasks: list[Task], make_env: Any, cfg: AgentLoopConfig, progress: bool, label: str,
                       env_pool: Any = None, annotate: Any = None) -> list:
    factory = lambda: make_env(cfg.env_kind)  # noqa: E731
    if not progress:
        return run_episodes(engine, tokenizer, tasks, factory, cfg, on_done=annotate, env_pool=env_pool)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]rollout[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("success {task.fields[succ]}"), TimeElapsedColumn(), transient=False) as bar:
        job = bar.add_task(label or "episodes", total=len(tasks), succ=0)
        done = {"succ": 0}

        def on_done(traj: Any) -> None:
            if annotate is not None:
                annotate(traj)
            if traj.verification is not None and traj.verification.success:
                done["succ"] += 1
            bar.update(job, advance=1, succ=done["succ"])

        return run_episodes(engine, tokenizer, tasks, factory, cfg, on_done=on_done, env_pool=env_pool)


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable table of a rollout summary."""
    lines = [
        f"episodes {summary['episodes']}  scored {summary['n']}  success {summary['success']} "
        f"({100 * summary['success_rate']:.1f}%)  mean score {summary['mean_score']:.3f}  "
        f"infra failures {summary['infra_failures']}",
        f"mean output tokens {summary['mean_output_tokens']:.1f}  tool calls {summary['mean_tool_calls']:.2f}  "
        f"turns {summary['mean_turns']:.2f}  finish {summary['finish_reasons']}",
    ]
    if summary.get("output_errors"):
        lines.append(f"malformed turns {summary['output_errors']}")
    for key in ("by_category", "by_domain"):
        lines.append(key.replace("_", " ") + ":")
        for name, b in summary[key].items():
            lines.append(f"  {name:<20} {b['success']:>4}/{b['n']:<4} {100 * b['success_rate']:5.1f}%")
    return "\n".join(lines)


def format_comparison(summaries: dict[str, dict[str, Any]]) -> str:
    """Side-by-side success (%) of several rollout summaries (e.g. untrained vs SFT): overall, by category, by domain."""
    if not summaries:
        raise ValueError("format_comparison: no summaries")
    names = list(summaries)
    width = max(12, *(len(n) for n in names))
    head = f"{'':<22}" + "".join(f"{n:>{width}}" for n in names)

    def cell(b: dict[str, Any] | None) -> str:
        if not b:
            return "-"
        return "{:.1f}% ({}/{})".format(100 * b["success_rate"], b["success"], b["n"])

    def row(label: str, blocks: list[dict[str, Any] | None]) -> str:
        return f"{label:<22}" + "".join(f"{cell(b):>{width}}" for b in blocks)

    lines = [head, row("overall", [summaries[n] for n in names])]
    for key in ("by_category", "by_domain"):
        keys = sorted({k for n in names for k in summaries[n][key]})
        lines.append(key.replace("_", " ") + ":")
        for k in keys:
            lines.append(row(f"  {k}", [summaries[n][key].get(k) for n in names]))
    return "\n".join(lines)
