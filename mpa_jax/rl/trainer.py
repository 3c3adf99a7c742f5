"""`run_rl`: online group-relative RL (CARE or vanilla) on the hybrid env mixture, in step with the sampler.

The loop only calls the roles: the task source and group rollouts (`rl/rollouts.py`, on the
`EpisodeRunner` and the engine), the advantage maths (`rl/care.py`) and the learner (`rl/learner.py`).
One RL step:
  1. draw `rl.tasks_per_step` groups across env kinds (`config.envs.mixture`; a group never mixes kinds);
  2. run `rl.group_size` rollouts of each through the runner on the sampler engine at `rl.temperature`
     (`SamplingParams.for_ratios` semantics); infra episodes are re-run, then dropped and counted per kind;
  3. verify, compute rewards and advantages (`rl.care`), update the competence table;
  4. `rl.ppo_epochs` x `rl.minibatches` learner updates over the packed rollouts (the first update's
     metrics give the behaviour-vs-learner log-prob gap at unchanged weights);
  5. sync the weights into the sampler (`engine.update_weights`: the embedded engine keeps its own copy;
     SGLang loads an HF export);
  6. log `rl/*` (per kind: `rl/success/<kind>`, `rl/episodes/<kind>`, `rl/infra_dropped/<kind>`) and `time/*`;
     checkpoint every `rl.checkpoint_every` steps and at the end.

Async mode (`rl.async_rollouts`): step k+1's rollouts are sampled in a background thread, with the weights of
version v_k, while step k trains; the prefetch is awaited before the sync (no weight swap mid-generation), so
every trained rollout is exactly one version stale (`rl/staleness`); rollouts more than `rl.max_staleness`
versions old are dropped (`rl/stale_dropped`). The prefetched rollouts are saved in the checkpoint.

Divergence: an update whose loss or gradient norm is not finite leaves the weights as they were and is
counted (`rl/nonfinite_updates`); a step with one is never checkpointed (the last good checkpoint stays);
`rl.max_bad_updates` such updates in a row stop the run with one clear error.

Determinism: the step's task draw, sampling seeds and minibatch shuffles are functions of (config.seed, step),
so a run resumed from a checkpoint (params, optimizer, rng, competence table, task cursors, weight version)
continues exactly as the uninterrupted run would have.
"""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from mpa_jax.rl import batch as rlbatch
from mpa_jax.rl import care
from mpa_jax.rl.rollouts import Rollouts, RLSetupError, TaskSource, split_tasks  # noqa: F401

__all__ = ["RLDiverged", "RLResult", "RLSetupError", "run_rl", "split_tasks"]


class RLDiverged(RuntimeError):
    """`rl.max_bad_updates` updates in a row had a non-finite loss or gradient norm; the last good
    checkpoint is kept."""


@dataclasses.dataclass
class RLResult:
    """What a finished (or stopped) RL run produced."""

    steps: int
    weight_version: int
    history: list[dict[str, float]]  # the per-step metric records of this process' run
    checkpoint_dir: str
    metrics_path: str
    resumed_from: int | None = None


def _load_init(config: Any, init: str | None, workdir: str) -> tuple[Any, Any, str | None]:
    """(model config, host params or None for random init, HF dir) from --init (HF dir or orbax run/checkpoint)."""
    import jax

    from mpa_jax import models
    from mpa_jax.train import checkpoint as ckpt

    init = init or str(config.model.init_from) or None
    if not init:
        return models.config_from_ml(config.model), None, None
    if not os.path.isdir(init):
        raise RLSetupError(f"--init {init} is not a directory")
    hf_dir = init
    # A run directory also holds a config.json (the resolved experiment config): weights decide.
    if not any(f.endswith(".safetensors") or f.endswith(".safetensors.index.json") for f in os.listdir(init)):
        from mpa_jax.export import export_checkpoint

        try:
            ckpt.find_step_dir(init)
        except ckpt.CheckpointError as e:
            raise RLSetupError(f"--init {init} is neither an HF directory (safetensors) nor an orbax checkpoint: {e}") from None
        tok_dir = next((d for d in (os.path.join(init, "tokenizer"), os.path.join(os.path.dirname(os.path.abspath(init)), "tokenizer"))
                        if os.path.isdir(d)), None)
        hf_dir = export_checkpoint(init, os.path.join(workdir, "init_hf"), dtype="float32", tokenizer_dir=tok_dir)
    model = models.from_pretrained(hf_dir, dtype=str(config.model.param_dtype))
    cfg = model.cfg.replace(compute_dtype=str(config.model.compute_dtype), param_dtype=str(config.model.param_dtype))
    return cfg, jax.device_get(model.params), hf_dir


def _check_config(config: Any) -> None:
    rl = config.rl
    care.check_rl_config(rl)
    if bool(rl.async_rollouts) and int(rl.max_staleness) < 1:
        raise RLSetupError(f"config.rl.max_staleness={rl.max_staleness} must be >= 1 with config.rl.async_rollouts=True")
    if int(rl.seq_len) < int(config.rollout.max_total_tokens):
        raise RLSetupError(f"config.rl.seq_len={rl.seq_len} must be >= config.rollout.max_total_tokens="
                           f"{config.rollout.max_total_tokens} (no episode may be cut)")
    if not float(rl.temperature) > 0:
        raise RLSetupError(f"config.rl.temperature={rl.temperature} must be > 0")
    if int(rl.max_bad_updates) < 1:
        raise RLSetupError(f"config.rl.max_bad_updates={rl.max_bad_updates} must be >= 1")


def run_rl(
    config: Any,
    workdir: str,
    *,
    init: str | None = None,
    max_steps: int | None = None,
    tokenizer: Any = None,
    runner: Any = None,
    on_step: Callable[[int, dict[str, float], Any, Any], None] | None = None,
    progress: bool = True,
) -> RLResult:
    """Run `config.rl.steps` RL steps into `workdir` (resuming from `<workdir>/checkpoints` when present).

    `init`: an HF directory or an orbax run/checkpoint dir to start from (else `config.model.init_from`,
    else random weights). `max_steps` stops early (the run can be resumed). `runner`: the
    `EpisodeRunner` to roll out through (default: the config's, `EpisodeRunner.from_config`; one given is
    not closed here). `on_step(step, metrics, state, engine)` is called after each step's sync (tests check
    learner == sampler weights there).
    """
    import jax

    from mpa_jax.rl.learner import Learner
    from mpa_jax.rollout.engines import load_rollout_tokenizer, make_engine
    from mpa_jax.rollout.runner import EpisodeRunner
    from mpa_jax.train import checkpoint as ckpt
    from mpa_jax.train import metrics as mlib

    rl = config.rl
    _check_config(config)
    total = int(rl.steps)
    stop_at = total if max_steps is None else min(total, int(max_steps))
    os.makedirs(workdir, exist_ok=True)
    source = TaskSource(config)  # before the slow parts: a bad task filter or mixture fails at once
    cfg, init_params, hf_dir = _load_init(config, init, workdir)
    if tokenizer is None:
        tokenizer = load_rollout_tokenizer(config, hf_dir, workdir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise RLSetupError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is {cfg.vocab_size}")
    vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < cfg.vocab_size else None
    templates = source.template_names
    key_id = {k: i for i, k in enumerate(templates)}
    learner = Learner(config, cfg, init_params, vocab_limit=vocab_limit, total_updates=total * int(rl.ppo_epochs) * int(rl.minibatches))

    meta = {"model": cfg.to_hf(), "rl": {"algo": str(rl.algo), "group_size": int(rl.group_size), "seq_len": int(rl.seq_len),
                                         "tasks": len(source.tasks), "templates": templates, "mixture": source.weights}}
    ck_dir = os.path.join(workdir, "checkpoints")
    checkpointer = ckpt.Checkpointer(ck_dir, every=max(1, int(rl.checkpoint_every)), keep=int(config.checkpoint.keep),
                                     async_save=bool(config.checkpoint.async_save), meta=meta)
    async_mode = bool(rl.async_rollouts)
    resumed_from = None
    history: list[dict[str, float]] = []
    writer = pool = None
    own_runner = runner is None
    try:
        latest = checkpointer.latest_step()
        prefetched = None
        competence = care.CompetenceTable(float(rl.competence_ema), float(rl.competence_init))
        version, dropped_total, bad_streak, start = 0, 0, 0, 0
        if latest is not None:
            state, _ = checkpointer.restore(latest, learner.abstract_state(),
                                            jax.ShapeDtypeStruct((2,), jax.numpy.int32, sharding=learner.replicated))
            learner.state = state
            extra = checkpointer.read_extra(latest)
            competence = care.CompetenceTable.from_dict(extra["competence"])
            source.restore(extra["cursor"])
            version, dropped_total, start = int(extra["weight_version"]), int(extra["infra_dropped"]), int(extra["rl_step"])
            resumed_from = latest
            if extra.get("prefetched") is not None:
                prefetched = Rollouts.from_dict(extra["prefetched"])

        engine = make_engine(config, params=learner.params, model_cfg=cfg, version=str(version), tokenizer=tokenizer,
                             tokenizer_dir=hf_dir, export_root=os.path.join(workdir, "sync"))
        runner = runner or EpisodeRunner.from_config(config)
        writer = mlib.MetricsWriter(workdir)
        pool = ThreadPoolExecutor(1, thread_name_prefix="rl-rollouts") if async_mode else None
        for step in range(start, stop_at):
            t_wait = time.perf_counter()
            if prefetched is not None and prefetched.step == step:
                rollouts = prefetched
            else:
                rollouts = source.collect(runner, engine, tokenizer, config, step)
            t_wait = time.perf_counter() - t_wait
            future = None
            if pool is not None and step + 1 < stop_at:
                # step k+1's rollouts sample with the current weights while step k trains (staleness 1)
                future = pool.submit(source.collect, runner, engine, tokenizer, config, step + 1)
            stale = rollouts.drop_stale(version, int(rl.max_staleness)) if async_mode else 0
            try:
                metrics, new_version, bad = _one_step(config, step, learner, engine, rollouts, competence, key_id, version,
                                                      before_sync=(lambda: _wait(future)) if future is not None else None)
            finally:
                prefetched = _wait(future) if future is not None else None
            version = new_version
            bad_streak = bad_streak + bad if bad else 0
            metrics["rl/stale_dropped"] = float(stale)
            metrics["time/rollout_wait_s"] = t_wait
            metrics["rl/staleness"] = float(rollouts.staleness(version - (1 if metrics["rl/updates"] > metrics["rl/nonfinite_updates"] else 0)))
            dropped_total += sum(rollouts.dropped.values())
            metrics["rl/infra_dropped_total"] = float(dropped_total)
            done = step + 1
            if bool(rl.save_rollouts):
                _save_rollouts(workdir, done, rollouts)
            if source.selector is not None:
                _save_competence(workdir, done, source)
            writer.write(done, metrics)
            history.append({"step": float(done), **metrics})
            if progress:
                print(f"rl step {done}/{total}: success {metrics['rl/success']:.3f} output_tokens {metrics['rl/output_tokens']:.1f}"
                      f" adv_std {metrics['rl/adv_std']:.3f} clip {metrics['rl/clip_frac']:.3f} gap {metrics['rl/logprob_gap']:.2e}"
                      + (f" NON-FINITE updates {bad}" if bad else ""), flush=True)
            if on_step is not None:
                on_step(done, metrics, learner.state, engine)
            if bad_streak >= int(rl.max_bad_updates):
                raise RLDiverged(f"{bad_streak} RL updates in a row had a non-finite loss, gradient norm or update (config.rl.max_bad_updates="
                                 f"{rl.max_bad_updates}); stopped at step {done}, weights unchanged since the last finite update; "
                                 f"last good checkpoint: {_last_good(checkpointer, ck_dir)}")
            final = done == stop_at
            if not bad and checkpointer.due(done, force=final):
                # async: the next step's rollouts (sampled with the weights before this step's update) are part
                # of the state; saving them keeps the resume exact
                extra = {"competence": competence.to_dict(), "cursor": source.state, "weight_version": version,
                         "infra_dropped": dropped_total, "rl_step": done,
                         "prefetched": prefetched.to_dict() if prefetched is not None else None}
                checkpointer.save(done, learner.state, learner.cursor_array(done, version), force=final, extra=extra)
        checkpointer.wait()
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if own_runner and runner is not None:
            runner.close()
        if writer is not None:
            writer.close()
        checkpointer.close()
    return RLResult(steps=stop_at, weight_version=version, history=history, checkpoint_dir=ck_dir,
                    metrics_path=os.path.join(workdir, "metrics.jsonl"), resumed_from=resumed_from)


def _save_rollouts(workdir: str, step: int, rollouts: Rollouts) -> None:
    """The step's verified rollouts as `<workdir>/rollouts/step_NNNNNN.jsonl` (rewritten when a resumed run
    repeats the step), the groups selection left out included: per-cell competence for the next round's data
    and failure traces for the harness."""
    from mpa_jax.envs.contract import write_jsonl

    out = os.path.join(workdir, "rollouts", f"step_{step:06d}.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_jsonl(out + ".tmp", rollouts.trajs + rollouts.unused)
    os.replace(out + ".tmp", out)


def _last_good(checkpointer: Any, ck_dir: str) -> str:
    step = checkpointer.latest_step()
    return "none written yet" if step is None else f"step {step} in {ck_dir}"


def _save_competence(workdir: str, step: int, source: TaskSource) -> None:
    """One line per step in `<workdir>/competence.jsonl`: the selection table's templates seen so far (step,
    template -> [successes, episodes, competence]; with a focus pool, its members and the retired templates);
    rewritten from the step on when a resumed run repeats it."""
    import json

    path = os.path.join(workdir, "competence.jsonl")
    lines = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f if ln.strip() and json.loads(ln)["step"] < step]
    c = source.competence()
    sel = source.selector
    row = {"step": step, "templates": {k: [s, n, round(c[k], 4)] for k, (s, n) in sel.counts.items() if n}}
    if sel.pool_size:  # the focus pool after the step: member -> [unanimous groups in a row, groups], and who left
        row.update(pool=sel.pool, retired=sel.retired)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(lines + [json.dumps(row, sort_keys=True) + "\n"])
    os.replace(path + ".tmp", path)


def _wait(future):
    return future.result() if future is not None else None


def _mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def _one_step(config: Any, step: int, learner: Any, engine: Any, rollouts: Rollouts, competence: care.CompetenceTable,
              key_id: dict[str, int], version: int, before_sync: Callable[[], Any] | None = None) -> tuple[dict[str, float], int, int]:
    """Advantages, the learner's updates and the weight sync of one step: (metrics, new version, non-finite updates)."""
    rl = config.rl
    trajs, groups = rollouts.trajs, rollouts.groups
    t1 = time.perf_counter()
    keys = [rollouts.draws[g][1].template for g in groups]
    success = np.asarray([bool(t.verification is not None and t.verification.success) for t in trajs], bool)
    score = np.asarray([float(t.verification.score) if t.verification is not None else 0.0 for t in trajs])
    out_tok = np.asarray([t.costs.get("output_tokens", 0.0) for t in trajs], np.float64)
    calls = np.asarray([t.costs.get("tool_calls", 0.0) for t in trajs], np.float64)
    comp = competence.lookup(keys)
    cost = care.rollout_cost(out_tok, calls, rl)
    key_arr = np.asarray([key_id[k] for k in keys], np.int64)
    adv = care.advantages(success=success, cost=cost, group=np.asarray(groups), key=key_arr, competence=comp, cfg=rl) \
        if len(trajs) else np.zeros(0)
    lam = care.lambda_schedule(comp, rl) if str(rl.algo) == "care" else np.zeros(len(trajs))
    competence.update(keys, success.astype(np.float64))

    seqs = []
    for tr, a in zip(trajs, adv):
        s, cut = rlbatch.sequence_from_trajectory(tr, float(a), learner.seq_len)
        if cut:  # run_rl checks rl.seq_len >= rollout.max_total_tokens: an episode this long is a bug upstream
            raise ValueError(f"an episode of {len(tr.tokens)} tokens does not fit a row of config.rl.seq_len={learner.seq_len}")
        # zero-advantage rollouts add no gradient (unless a KL term pulls towards the reference)
        if s.loss_mask[1:].sum() > 0 and (a != 0 or float(rl.kl_coef) > 0):
            seqs.append(s)
    updates, layout = learner.update(seqs, step)
    t_train = time.perf_counter() - t1
    bad = sum(int(u.get("nonfinite", 0.0) > 0) for u in updates)

    if before_sync is not None:
        before_sync()  # async: the prefetch must not see a weight swap mid-generation
    t2 = time.perf_counter()
    if len(updates) > bad:
        version += 1
        engine.update_weights(learner.params, str(version))  # the engine copies (the train step donates its state)
    t_sync = time.perf_counter() - t2

    good = [u for u in updates if not u.get("nonfinite", 0.0)]
    first = updates[0] if updates else {}
    zero_var = care.zero_variance_groups(np.asarray(groups), adv) + (len(rollouts.draws) - len(set(groups)))

    def upd(k: str) -> float:
        return _mean([u[k] for u in good if k in u])

    metrics = {
        "rl/success": _mean(success.astype(float)),
        "rl/score": _mean(score),
        "rl/output_tokens": _mean(out_tok),
        "rl/tool_calls": _mean(calls),
        "rl/competence": _mean(comp),
        "rl/competence_global": competence.global_value,
        "rl/lambda": _mean(lam),
        "rl/adv_mean": _mean(adv),
        "rl/adv_std": float(np.std(adv)) if len(adv) else float("nan"),
        "rl/zero_var_groups": float(zero_var),
        "rl/clip_frac": upd("clip_frac"),
        "rl/kl": upd("kl"),
        "rl/entropy": upd("entropy"),
        "rl/ratio_mean": upd("ratio"),
        "rl/ratio_max": max((u["ratio_max"] for u in good), default=float("nan")),
        "rl/ratio_min": min((u["ratio_min"] for u in good), default=float("nan")),
        "rl/logprob_gap": first.get("logprob_gap", float("nan")),
        "rl/loss": upd("loss"),
        "rl/grad_norm": upd("grad_norm"),
        "rl/lr": first.get("lr", float("nan")),
        "rl/updates": float(len(updates)),
        "rl/nonfinite_updates": float(bad),
        "rl/train_tokens": float(sum(u["tokens"] for u in good)),
        "rl/rollouts": float(len(trajs)),
        "rl/row_len": float(layout["row_len"]),
        "rl/rows_per_device": float(layout["rows_per_device"]),
        "rl/micro_batches": float(layout["micro_batches"]),
        "rl/weight_version": float(version),
        "rl/infra_dropped": float(sum(rollouts.dropped.values())),
        "rl/groups_drawn": float(rollouts.drawn or len(rollouts.draws)),
        "rl/groups_kept": float(len(rollouts.draws)),
        # zero-variance share of what was drawn: selection drops such groups before training
        "rl/zero_var_share": float(1.0 - (len(rollouts.draws) - zero_var) / max(rollouts.drawn or len(rollouts.draws), 1)),
        "time/rollout_s": rollouts.rollout_s,
        "time/train_s": t_train,
        "time/sync_s": t_sync,
    }
    for kind in sorted({k for k, _ in rollouts.draws} | set(rollouts.dropped)):
        idx = [i for i in range(len(trajs)) if rollouts.kind_of(i) == kind]
        metrics[f"rl/episodes/{kind}"] = float(len(idx))
        metrics[f"rl/success/{kind}"] = _mean(success[idx].astype(float)) if idx else float("nan")
        metrics[f"rl/infra_dropped/{kind}"] = float(rollouts.dropped.get(kind, 0))
    return metrics, version, bad
