"""`run_rl`: online group-relative RL (CARE or vanilla) on the env mixture, in step with the sampler.

The loop only calls the roles (DESIGN §7a, like tunix's learner: generate / update / sync):

    worker   rl/worker.py     RolloutWorker: tasks in (rl/tasks.py), scored groups out, async prefetch, sync
    care     rl/advantage.py  Care: advantages from rollouts and competence (rl/care.py, rl/competence.py)
    learner  rl/learner.py    Learner: the train state and `update`
    log      rl/step_log.py   metrics.jsonl, competence.jsonl, the console line

One step: the worker's groups (with selection: templates drawn by the competence table as it stood, and only the
groups the matched-arms rule keeps: `care.selection()`) -> `care.score` (the same table) -> `care.observe` (every
verified episode of the step) -> `learner.update` -> `worker.sync` when the weights moved -> log -> checkpoint every
`rl.checkpoint_every` steps and at the end.

`run_rl` is the one place in `rl/` that holds the whole experiment config: the roles get their sections (`rl`,
`rollout`, `envs`, `tasks`, the seed) and the factories outside `rl/` theirs (`engine_for_weights`,
`EpisodeRunner.from_sections`, `tokenizer_for_sections`). The start is named the way every command names one
(`init`: `mpa_jax.start`, fitted to the config: its shape, tokenizer, context format, positions). SIGINT/SIGTERM stop at the
next step boundary with a checkpoint (`train.preemption`) and one line; a second signal exits at once.

Async mode (`rl.async_rollouts`): step k+1's rollouts are sampled in the background with the weights of version v_k
while step k trains; the worker waits for them before the sync (no weight swap mid-generation), so every trained
rollout is exactly one version stale (`rl/staleness`); rollouts more than `rl.max_staleness` versions old are
dropped (`rl/stale_dropped`). The prefetched rollouts are saved in the checkpoint.

Divergence: an update whose loss or gradient norm is not finite leaves the weights as they were and is counted
(`rl/nonfinite_updates`); a step with one is never checkpointed (the last good checkpoint stays);
`rl.max_bad_updates` such updates in a row stop the run with one clear error.

Determinism: the step's task draw, sampling seeds and minibatch shuffles are functions of (config.seed, step), so a
run resumed from a checkpoint (params, optimizer, rng, competence table, task cursors, weight version, prefetched
rollouts) continues exactly as the uninterrupted run would have.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

from mpa_jax.rl.errors import RLDiverged, RLSetupError
from mpa_jax.rl.rollouts import Rollouts
from mpa_jax.rl.tasks import split_tasks

__all__ = ["RLDiverged", "RLResult", "RLSetupError", "run_rl", "split_tasks"]


@dataclasses.dataclass
class RLResult:
    """What a finished (or stopped) RL run produced."""

    steps: int
    weight_version: int
    history: list[dict[str, float]]  # the per-step metric records of this process' run
    checkpoint_dir: str
    metrics_path: str
    resumed_from: int | None = None
    interrupted: str | None = None  # the one line of a run stopped by SIGINT/SIGTERM


def run_rl(config: Any, workdir: str, *, init: str | None = None, max_steps: int | None = None, tokenizer: Any = None,
           runner: Any = None, on_step: Callable[[int, dict[str, float], Any, Any], None] | None = None, progress: bool = True,
           split: str | None = None, selection: str | None = None, prior: str | None = None) -> RLResult:
    """Run `config.rl.steps` RL steps into `workdir` (resuming from `<workdir>/checkpoints` when present).

    `init`: a start (an HF directory, an orbax run directory or `starter`) the config is fitted to first
    (`mpa_jax.start.fit_start`; the CLI's `--checkpoint` has fitted it already), else `config.model.init_from`
    (an HF directory), else random weights. `max_steps` stops early (the run can be resumed). `runner`: the
    `EpisodeRunner` to roll out through (default: the config's; one given is not closed here). `on_step(step, metrics, state, engine)` is called after
    each step's sync (tests check learner == sampler weights there). `split` / `selection` / `prior` override
    `rl.split` / `rl.selection` / `rl.select_prior` (the loop passes its own; the prior also seeds competence).
    """
    import jax

    from mpa_jax import sharding
    from mpa_jax.rl.advantage import Care
    from mpa_jax.rl.competence import CompetenceTable
    from mpa_jax.rl.learner import Learner
    from mpa_jax.rl.start import check_config, load_init
    from mpa_jax.rl.step_log import console_line, step_metrics, write_competence
    from mpa_jax.rl.tasks import TaskSource
    from mpa_jax.rl.worker import RolloutWorker
    from mpa_jax.rollout.engines import engine_for_weights
    from mpa_jax.rollout.runner import EpisodeRunner
    from mpa_jax.start import StartError, fit_start
    from mpa_jax.tokenizer.select import tokenizer_for_sections
    from mpa_jax.train import checkpoint as ckpt
    from mpa_jax.train import metrics as mlib
    from mpa_jax.train.preemption import Preemption

    check_config(config.rl, config.rollout)
    os.makedirs(workdir, exist_ok=True)
    # before the slow parts: a bad task filter or mixture fails at once
    source = TaskSource(config.rl, config.envs, config.tasks, int(config.seed), split=split, selection=selection, prior=prior)
    if init:  # a copy fitted to the start: its shape, tokenizer, context format, positions
        try:
            config = fit_start(config, init, workdir=workdir)[0]
        except StartError as e:
            raise RLSetupError(f"init {init}: {e}") from None
        check_config(config.rl, config.rollout)
    rl, seed, rules = config.rl, int(config.seed), sharding.rules_from_config(config)
    total = int(rl.steps)
    stop_at = total if max_steps is None else min(total, int(max_steps))
    cfg, init_params, hf_dir = load_init(config.model)
    if tokenizer is None:
        tokenizer = tokenizer_for_sections(tokenizer=config.tokenizer, model=config.model, context=config.context,
                                           oracle=config.oracle, seed=seed, workdir=workdir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise RLSetupError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is {cfg.vocab_size}")
    learner = Learner(rl, cfg, init_params, mesh=config.mesh, rules=rules, seed=seed, logprob_chunk=int(config.model.logprob_chunk),
                      vocab_limit=tokenizer.vocab_size if tokenizer.vocab_size < cfg.vocab_size else None,
                      total_updates=total * int(rl.ppo_epochs) * int(rl.minibatches))
    meta = {"model": cfg.to_hf(), "rl": {"algo": str(rl.algo), "group_size": int(rl.group_size), "seq_len": int(rl.seq_len),
                                         "tasks": len(source.tasks), "templates": source.template_names, "mixture": source.weights}}
    ck_dir = os.path.join(workdir, "checkpoints")
    checkpointer = ckpt.Checkpointer(ck_dir, every=max(1, int(rl.checkpoint_every)), keep=int(config.checkpoint.keep),
                                     async_save=bool(config.checkpoint.async_save), meta=meta)
    history: list[dict[str, float]] = []
    writer = worker = None
    own_runner = runner is None
    resumed_from = interrupted = None
    try:
        table = CompetenceTable.from_config(rl)
        version, dropped_total, bad_streak, start, prefetched = 0, 0, 0, 0, None
        latest = checkpointer.latest_step()
        if latest is not None:
            learner.state, _ = checkpointer.restore(latest, learner.abstract_state(),
                                                    jax.ShapeDtypeStruct((2,), jax.numpy.int32, sharding=learner.replicated))
            extra = checkpointer.read_extra(latest)
            table = CompetenceTable.from_dict(extra["competence"])
            source.restore(extra["cursor"])
            version, dropped_total, start = int(extra["weight_version"]), int(extra["infra_dropped"]), int(extra["rl_step"])
            prefetched = Rollouts.from_dict(extra["prefetched"]) if extra.get("prefetched") is not None else None
            resumed_from = latest
        else:
            table.seed(source.prior_trajs)  # the data stage's probe of this policy, where there is one
        care = Care(rl, table)
        engine = engine_for_weights(config.rollout, mesh=config.mesh, rules=rules, serve=config.serve, params=learner.params,
                                    model_cfg=cfg, version=str(version), tokenizer=tokenizer, tokenizer_dir=hf_dir,
                                    export_root=os.path.join(workdir, "sync"))
        runner = runner or EpisodeRunner.from_sections(envs=config.envs, context=config.context, harness=config.harness,
                                                           security=config.security)
        worker = RolloutWorker(source, runner, engine, tokenizer, rl=rl, rollout=config.rollout, seed=seed)
        worker.restore(prefetched)
        # A resumed run rewrites the steps after its checkpoint: the JSONL and TensorBoard drop the old ones.
        writer = mlib.MetricsWriter(workdir, keep_through=-1 if resumed_from is None else resumed_from)
        with Preemption() as pre:
            for step in range(start, stop_at):
                t0 = time.perf_counter()
                rollouts = worker.rollouts(step, version, care.selection() if source.selector is not None else None)
                t_wait = time.perf_counter() - t0
                if worker.async_mode and step + 1 < stop_at:
                    worker.prefetch(step + 1, care.selection() if source.selector is not None else None)
                scored = care.score(rollouts)  # the table as it stood when the step was sampled
                care.observe(rollouts)
                t1 = time.perf_counter()
                report = learner.update(rollouts.trajs, scored.advantages, step)
                t_train, t_sync, v0 = time.perf_counter() - t1, 0.0, version
                if report.changed:
                    version += 1
                    t_sync = worker.sync(learner.params, version)
                bad_streak = bad_streak + report.nonfinite if report.nonfinite else 0
                dropped_total += sum(rollouts.dropped.values())
                done = step + 1
                metrics = step_metrics(rollouts, scored, report, table, version=version,
                                       times={"rollout_s": rollouts.rollout_s, "rollout_wait_s": t_wait, "train_s": t_train, "sync_s": t_sync})
                metrics.update({"rl/stale_dropped": float(worker.stale_dropped), "rl/staleness": float(rollouts.staleness(v0)),
                                "rl/infra_dropped_total": float(dropped_total)})
                if bool(rl.save_rollouts):
                    _save_rollouts(workdir, done, rollouts)
                write_competence(workdir, done, scored, table, _selection_state(source, table))
                writer.write(done, metrics)
                history.append({"step": float(done), **metrics})
                if progress:
                    print(console_line(done, total, metrics), flush=True)
                if on_step is not None:
                    on_step(done, metrics, learner.state, engine)
                if bad_streak >= int(rl.max_bad_updates):
                    raise RLDiverged(f"{bad_streak} RL updates in a row had a non-finite loss, gradient norm or update (config.rl.max_bad_updates="
                                     f"{rl.max_bad_updates}); stopped at step {done}, weights unchanged since the last finite update; "
                                     f"last good checkpoint: {_last_good(checkpointer, ck_dir)}")
                final = done == stop_at or pre.requested
                if not report.nonfinite and checkpointer.due(done, force=final):
                    # async: the next step's rollouts (sampled before this step's update) are part of the state
                    pending = worker.pending()
                    extra = {"competence": table.to_dict(), "cursor": source.state, "weight_version": version,
                             "infra_dropped": dropped_total, "rl_step": done, "prefetched": pending.to_dict() if pending is not None else None}
                    checkpointer.save(done, learner.state, learner.cursor_array(done, version), force=final, extra=extra)
                if pre.requested and done < stop_at:  # (a signal during the last step: the run is complete)
                    interrupted = (pre.message(done, ck_dir) if not report.nonfinite else
                                   f"interrupted ({pre.signal_name}) after step {done}, not saved (a non-finite update); "
                                   f"last good checkpoint: {_last_good(checkpointer, ck_dir)}")
                    stop_at = done
                    break
        checkpointer.wait()
    finally:
        if worker is not None:
            worker.close()
        if own_runner and runner is not None:
            runner.close()
        if writer is not None:
            writer.close()
        checkpointer.close()
    return RLResult(steps=stop_at, weight_version=version, history=history, checkpoint_dir=ck_dir,
                    metrics_path=os.path.join(workdir, "metrics.jsonl"), resumed_from=resumed_from, interrupted=interrupted)


def _selection_state(source: Any, table: Any) -> dict[str, Any] | None:
    """What competence-aware selection draws by, for competence.jsonl (None without selection): per template with
    evidence of its own, [its competence in the table, the (decayed) episodes behind it]."""
    sel = source.selector
    if sel is None:
        return None
    from mpa_jax.rl.competence import keys_of_template

    row: dict[str, Any] = {"templates": {t.name: [round(table.get(*keys_of_template(t)), 4), round(table.evidence(keys_of_template(t)[0]), 2)]
                                         for t in sel.templates if table.has_own(keys_of_template(t)[0])}}
    return row


def _save_rollouts(workdir: str, step: int, rollouts: Rollouts) -> None:
    """The step's verified rollouts as `<workdir>/rollouts/step_NNNNNN.jsonl` (rewritten when a resumed run
    repeats the step), the groups selection left out included: per-cell competence for the next round's data
    and failure traces for the harness."""
    from mpa_jax.files import write_jsonl

    write_jsonl(os.path.join(workdir, "rollouts", f"step_{step:06d}.jsonl"), rollouts.trajs + rollouts.unused)


def _last_good(checkpointer: Any, ck_dir: str) -> str:
    step = checkpointer.latest_step()
    return "none written yet" if step is None else f"step {step} in {ck_dir}"


