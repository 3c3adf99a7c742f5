"""`run_rl`: online group-relative RL (CARE or vanilla) over the sandbox tasks, in step with the sampler.

One RL step:
  1. draw `rl.tasks_per_step` train tasks (a seeded permutation per epoch; the cursor is checkpointed);
  2. run `rl.group_size` rollouts of each through the agent loop on the sampler engine, sampling with
     `SamplingParams.for_ratios` semantics (top_p=1, top_k=-1) at `rl.temperature`; episodes that end
     in an infra failure are re-run (new seeds) up to `rl.infra_retries` times, then dropped and
     counted, never rewarded;
  3. verify (the env's Verification), compute rewards and advantages (`rl.care`), update the
     competence table;
  4. `rl.ppo_epochs` passes of `rl.minibatches` optimizer updates over the packed rollouts (the first
     update's metrics give the behaviour-vs-learner log-prob gap at unchanged weights);
  5. sync the weights into the sampler (a fresh copy for the embedded engine, so the engine never holds
     a buffer the next train step donates; an HF export + `/update_weights_from_disk` for SGLang);
  6. log `rl/*` and `time/*` metrics; checkpoint every `rl.checkpoint_every` steps and at the end.

Async mode (`rl.async_rollouts`): step k+1's rollouts are sampled in a background thread, with the
weights of version v_k, while step k trains; the prefetch is awaited before the sync (no weight swap
mid-generation), so every trained rollout is exactly one version stale (`rl/staleness`); rollouts more
than `rl.max_staleness` versions old are dropped (`rl/stale_dropped`). The prefetched rollouts are
saved in the checkpoint. Multi-device CPU meshes work (the async test runs on 8 host devices); they
were refused before the token-budgeted update, when a stall of the one big multi-device train step
next to the engine's decode thread was seen (docs/experiments.md, "RL trainer notes").

Determinism: the step's task draw, sampling seeds and minibatch shuffles are functions of
(config.seed, step), so a run resumed from a checkpoint (params, optimizer, rng, competence table,
task cursor, weight version) continues exactly as the uninterrupted run would have.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mpa_jax import models, sharding
from mpa_jax.rl import batch as rlbatch
from mpa_jax.rl import care
from mpa_jax.rl import update as rlupdate
from mpa_jax.rl.loss import FIELDS, make_rl_loss, policy_logprobs
from mpa_jax.train import checkpoint as ckpt
from mpa_jax.train import metrics as mlib
from mpa_jax.train import optimizer as optlib
from mpa_jax.train import state as statelib
from mpa_jax.train import step as steplib


class RLSetupError(ValueError):
    """The RL run cannot start: a config key, the init checkpoint or the task filter is wrong (named)."""


@dataclasses.dataclass
class RLResult:
    """What a finished (or stopped) RL run produced."""

    steps: int
    weight_version: int
    history: list[dict[str, float]]  # the per-step metric records of this process' run
    checkpoint_dir: str
    metrics_path: str
    resumed_from: int | None = None


def copy_params(params: Any) -> Any:
    """A copy of `params` in fresh buffers (the train step donates the state's buffers)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


def _step_seed(seed: int, step: int, attempt: int = 0) -> int:
    return (int(seed) * 1_000_003 + int(step) * 7_919 + int(attempt) * 104_729) % (2**31 - 1)


class TaskCursor:
    """Train tasks drawn in a seeded permutation per epoch; `position` (tasks drawn so far) is the state."""

    def __init__(self, tasks: Sequence[Any], seed: int, position: int = 0):
        self.tasks = list(tasks)
        self.seed = int(seed)
        self.position = int(position)

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def draw(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.tasks))
            out.append(self.tasks[int(self._order(epoch)[i])])
            self.position += 1
        return out


def select_tasks(config: Any) -> list[Any]:
    """The train tasks of `rl.split`, restricted to `rl.templates` when set."""
    from mpa_jax.envs import load_tasks

    tasks = list(load_tasks(str(config.rl.split), seed=int(config.tasks.seed), per_template=int(config.tasks.per_template)))
    names = [t.strip() for t in str(config.rl.get("templates", "") or "").split(",") if t.strip()]
    if names:
        known = {t.template for t in tasks}
        missing = [n for n in names if n not in known]
        if missing:
            raise RLSetupError(f"config.rl.templates: no task of split {config.rl.split!r} has template(s) {missing}")
        tasks = [t for t in tasks if t.template in set(names)]
    if not tasks:
        raise RLSetupError(f"config.rl.split={config.rl.split!r} has no tasks")
    return tasks


def _load_init(config: Any, init: str | None, workdir: str) -> tuple[models.ModelConfig, Any, str | None]:
    """(model config, host params or None for random init, HF dir) from --init (HF dir or orbax run/checkpoint)."""
    if not init:
        init = str(config.model.get("init_from", "") or "") or None
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


def make_rl_optimizer(rl: Any, total_updates: int):
    return optlib.make_optimizer(
        lr=float(rl.lr), warmup_steps=int(rl.warmup_steps), total_steps=max(1, int(total_updates)),
        weight_decay=float(rl.weight_decay), clip_norm=float(rl.clip_norm), b1=float(rl.b1), b2=float(rl.b2),
        end_ratio=float(rl.get("lr_end_ratio", 1.0)), kind=str(rl.get("optimizer", "adamw")),
    )


def _opt_key(rl: Any, total_updates: int) -> tuple:
    return tuple((k, rl.get(k, None)) for k in ("optimizer", "lr", "warmup_steps", "weight_decay", "clip_norm", "b1", "b2", "lr_end_ratio")) + (
        ("total", int(total_updates)),)


@functools.lru_cache(maxsize=4)
def _compiled_step(cfg: models.ModelConfig, loss_key: tuple, opt_key: tuple, mesh: Any, rules: tuple) -> rlupdate.BudgetedUpdate:
    """The RL update (jitted accumulate/apply pieces, `rl.update`) for one (model, loss, optimizer, mesh)
    setting, cached so that runs repeated in one process (resume, tests, the experiment's arms) reuse
    the compiled executables."""
    import ml_collections

    temperature, clip_low, clip_high, kl_coef, chunk, vocab_limit = loss_key
    d = dict(opt_key)
    optimizer, schedule = make_rl_optimizer(ml_collections.ConfigDict({k: v for k, v in d.items() if k != "total" and v is not None}), d["total"])
    params_shape = cfg.abstract_params()
    st_shardings = statelib.state_shardings(mesh, params_shape, sharding.param_shardings(cfg, mesh, rules), optimizer)
    row_shard = sharding.batch_sharding(mesh, rules, 2)
    loss_fn = make_rl_loss(cfg, temperature=temperature, clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef,
                           chunk=chunk, vocab_limit=vocab_limit)
    return rlupdate.BudgetedUpdate(loss_fn, optimizer, schedule, st_shardings, row_shard)


def budgeted_micro_batches(seqs: Sequence[rlbatch.RLSequence], seq_len: int, tokens_per_micro_batch: int,
                           dp: int) -> tuple[list[dict[str, np.ndarray]], int, int]:
    """(micro-batches, row length, rows per device) of one minibatch under the token budget: rows sized to
    the longest episode (`rl.update.row_length`), at most `tokens_per_micro_batch` tokens per device."""
    row_len = rlupdate.row_length(max(int(s.tokens.shape[0]) for s in seqs), seq_len)
    packed = rlbatch.pack(seqs, row_len, pow2_rows=False)
    n_rows = next(iter(packed.values())).shape[0]
    rpd = rlupdate.rows_per_device(row_len, tokens_per_micro_batch, -(-n_rows // dp))
    rows_per_micro = rpd * dp
    padded = -(-n_rows // rows_per_micro) * rows_per_micro
    if padded > n_rows:  # padding rows: segment 0, weight 0 (no loss, no tokens)
        packed = {k: np.concatenate([v, np.zeros((padded - n_rows,) + v.shape[1:], v.dtype)]) for k, v in packed.items()}
    return rlupdate.split_rows(packed, rows_per_micro), row_len, rpd


def _make_engine(config: Any, cfg: models.ModelConfig, params: Any, version: int, workdir: str, tokenizer_dir: str | None,
                 vocab_limit: int | None = None):
    kind = str(config.rollout.engine)
    if kind == "jax":
        from mpa_jax.rollout.jax_engine import JaxEngine
        from mpa_jax.rollout.run import engine_replicas

        return JaxEngine(cfg, copy_params(params), max_batch=int(config.rollout.batch_size), weight_version=str(version),
                         replicas=engine_replicas(config), vocab_limit=vocab_limit)
    if kind == "sglang":
        from mpa_jax.rollout.sglang import engine_from_config, hf_exporter

        # Exported in the learner's parameter dtype (the exporter's default is bfloat16): the server loads
        # exactly the learner's weights (it may still cast them to its own --dtype).
        engine = engine_from_config(config, exporter=hf_exporter(cfg, tokenizer_dir, dtype=str(cfg.param_dtype)),
                                    export_root=os.path.join(workdir, "sync"), vocab_limit=vocab_limit)
        engine.update_weights(jax.device_get(params), str(version))
        return engine
    raise RLSetupError(f"config.rollout.engine must be 'jax' or 'sglang', got {kind!r}")


def sync_weights(engine: Any, params: Any, version: int) -> None:
    """Put the learner's params into the sampler under `version` (copied: the engine owns its buffers)."""
    if hasattr(engine, "_place"):  # the embedded engine: in process
        engine.update_weights(copy_params(params), str(version))
    else:
        engine.update_weights(jax.device_get(params), str(version))


def run_group_rollouts(engine: Any, tokenizer: Any, tasks: Sequence[Any], config: Any, step: int,
                       env_factory: Callable[[], Any] | None = None) -> tuple[list[Any], list[int], int]:
    """`group_size` rollouts of each task; returns (trajectories, group index per trajectory, dropped).

    Infra-failed episodes are re-run with fresh seeds up to `rl.infra_retries` times, then dropped.
    """
    from mpa_jax.envs import make_env
    from mpa_jax.rollout.agent_loop import AgentLoopConfig, run_episodes

    rl = config.rl
    g = int(rl.group_size)
    factory = env_factory or (lambda: make_env("sandbox"))
    pending = [(gi, t) for gi, t in enumerate(tasks) for _ in range(g)]
    done: list[tuple[int, Any]] = []
    for attempt in range(int(rl.infra_retries) + 1):
        if not pending:
            break
        loop_cfg = AgentLoopConfig.from_config(config.rollout, seed=_step_seed(config.seed, step, attempt),
                                               temperature=float(rl.temperature), top_p=1.0, top_k=-1,
                                               planner=f"rl-{rl.algo}")
        trajs = run_episodes(engine, tokenizer, [t for _, t in pending], factory, loop_cfg)
        retry = []
        for (gi, task), tr in zip(pending, trajs):
            if tr.infra_failure:
                retry.append((gi, task))
            else:
                tr.provenance["sampling"] = {"temperature": float(rl.temperature), "top_p": 1.0, "top_k": -1,
                                             "seed": loop_cfg.seed, "for_ratios": True}
                done.append((gi, tr))
        pending = retry
    return [t for _, t in done], [gi for gi, _ in done], len(pending)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def run_rl(
    config: Any,
    workdir: str,
    *,
    init: str | None = None,
    max_steps: int | None = None,
    tokenizer: Any = None,
    env_factory: Callable[[], Any] | None = None,
    on_step: Callable[[int, dict[str, float], Any, Any], None] | None = None,
    progress: bool = True,
) -> RLResult:
    """Run `config.rl.steps` RL steps into `workdir` (resuming from `<workdir>/checkpoints` when present).

    `init`: an HF directory or an orbax run/checkpoint dir to start from (else `config.model.init_from`,
    else random weights). `max_steps` stops early (the run can be resumed). `on_step(step, metrics,
    state, engine)` is called after each step's sync (tests check learner == sampler weights there).
    """
    rl = config.rl
    care.check_rl_config(rl)
    async_mode = bool(rl.get("async_rollouts", False))
    if async_mode and int(rl.max_staleness) < 1:
        raise RLSetupError(f"config.rl.max_staleness={rl.max_staleness} must be >= 1 with config.rl.async_rollouts=True")
    total = int(rl.steps)
    stop_at = total if max_steps is None else min(total, int(max_steps))
    os.makedirs(workdir, exist_ok=True)
    seq_len = int(rl.seq_len)
    if seq_len < int(config.rollout.max_total_tokens):
        raise RLSetupError(f"config.rl.seq_len={seq_len} must be >= config.rollout.max_total_tokens="
                           f"{config.rollout.max_total_tokens} (no episode may be cut)")
    temperature = float(rl.temperature)
    if not temperature > 0:
        raise RLSetupError(f"config.rl.temperature={temperature} must be > 0")
    tasks = select_tasks(config)  # before the slow parts: a bad task filter fails at once
    cfg, init_params, hf_dir = _load_init(config, init, workdir)
    if tokenizer is None:
        from mpa_jax.rollout.run import load_rollout_tokenizer

        tokenizer = load_rollout_tokenizer(config, hf_dir, workdir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise RLSetupError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is {cfg.vocab_size}")
    vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < cfg.vocab_size else None
    templates = sorted({t.template for t in tasks})
    key_id = {k: i for i, k in enumerate(templates)}

    mesh = sharding.make_learner_mesh(config.mesh)
    rules = sharding.rules_from_config(config)
    row_shard = sharding.batch_sharding(mesh, rules, 2)
    replicated = NamedSharding(mesh, P())
    dp = math.prod(mesh.shape[a] for a in ("data", "fsdp") if a in mesh.shape)
    budget = int(rl.tokens_per_micro_batch)
    try:
        rlupdate.check_budget(seq_len, budget)
    except ValueError as e:
        raise RLSetupError(str(e)) from None
    updates_per_step = int(rl.ppo_epochs) * int(rl.minibatches)
    optimizer, schedule = make_rl_optimizer(rl, total * updates_per_step)
    family = models.registry.family_module(cfg.family)
    params_shape = cfg.abstract_params()
    p_shardings = sharding.param_shardings(cfg, mesh, rules)
    st_shardings = statelib.state_shardings(mesh, params_shape, p_shardings, optimizer)
    kl_coef = float(rl.kl_coef)
    chunk = int(config.model.get("logprob_chunk", 1024))
    step_fn = _compiled_step(cfg, (temperature, float(rl.clip_low), float(rl.clip_high), kl_coef, chunk, vocab_limit),
                             _opt_key(rl, total * updates_per_step), mesh, rules)

    meta = {"model": cfg.to_hf(), "rl": {"algo": str(rl.algo), "group_size": int(rl.group_size), "seq_len": seq_len,
                                         "tasks": len(tasks), "templates": templates}}
    ck_dir = os.path.join(workdir, "checkpoints")
    checkpointer = ckpt.Checkpointer(ck_dir, every=max(1, int(rl.checkpoint_every)), keep=int(config.checkpoint.keep),
                                     async_save=bool(config.checkpoint.async_save), meta=meta)
    resumed_from = None
    history: list[dict[str, float]] = []
    writer = None
    pool = None
    try:
        latest = checkpointer.latest_step()
        prefetched = None
        competence = care.CompetenceTable(float(rl.competence_ema), float(rl.competence_init))
        cursor = TaskCursor(tasks, int(config.seed))
        version, dropped_total = 0, 0
        if latest is not None:
            abstract = statelib.abstract_state(params_shape, optimizer, st_shardings)
            state, _ = checkpointer.restore(latest, abstract, jax.ShapeDtypeStruct((2,), jnp.int32, sharding=replicated))
            extra = checkpointer.read_extra(latest)
            competence = care.CompetenceTable.from_dict(extra["competence"])
            cursor.position = int(extra["cursor"])
            version, dropped_total = int(extra["weight_version"]), int(extra["infra_dropped"])
            start = int(extra["rl_step"])
            resumed_from = latest
            if extra.get("prefetched") is not None:
                prefetched = _Rollouts.from_dict(extra["prefetched"], tasks)
        else:
            if init_params is None:
                state = statelib.create_sharded_state(lambda r: family.init_params(cfg, r), optimizer, int(config.seed), st_shardings)
            else:
                state = statelib.state_from_params(init_params, optimizer, int(config.seed), st_shardings)
            start = 0
        ref_params = None
        ref_fn = None
        if kl_coef > 0:
            # The frozen reference: the init weights (random init is reproducible from the seed).
            ref_state = (statelib.state_from_params(init_params, optimizer, int(config.seed), st_shardings) if init_params is not None
                         else statelib.create_sharded_state(lambda r: family.init_params(cfg, r), optimizer, int(config.seed), st_shardings))
            ref_params = ref_state.params
            ref_fn = jax.jit(lambda p, b: policy_logprobs(cfg, p, b, temperature=temperature, chunk=chunk, vocab_limit=vocab_limit)[0])

        engine = _make_engine(config, cfg, state.params, version, workdir, hf_dir, vocab_limit)
        writer = mlib.MetricsWriter(workdir)
        pool = ThreadPoolExecutor(1, thread_name_prefix="rl-rollouts") if async_mode else None
        for step in range(start, stop_at):
            t_wait = time.perf_counter()
            if prefetched is not None and prefetched.step == step:
                rollouts = prefetched
            else:
                rollouts = _collect(config, step, engine, tokenizer, cursor, env_factory)
            t_wait = time.perf_counter() - t_wait
            future = None
            if pool is not None and step + 1 < stop_at:
                # Step k+1's rollouts sample with the current weights while step k trains (staleness 1).
                next_tasks = cursor.draw(int(rl.tasks_per_step))
                future = pool.submit(_collect, config, step + 1, engine, tokenizer, None, env_factory, next_tasks)
            stale = _drop_stale(rollouts, version, int(rl.max_staleness)) if async_mode else 0
            try:
                metrics, state, new_version, dropped = _one_step(
                    config, step, state, engine, tokenizer, rollouts, competence, key_id, step_fn, ref_fn, ref_params,
                    row_shard, dp, budget, seq_len, version,
                    before_sync=(lambda: _wait(future)) if future is not None else None,
                )
            finally:
                prefetched = _wait(future) if future is not None else None
            version = new_version
            metrics["rl/stale_dropped"] = float(stale)
            metrics["time/rollout_wait_s"] = t_wait
            metrics["rl/staleness"] = float(rollouts.staleness(version - (1 if metrics["rl/updates"] else 0)))
            dropped_total += dropped
            metrics["rl/infra_dropped_total"] = float(dropped_total)
            done = step + 1
            if bool(rl.get("save_rollouts", True)):
                _save_rollouts(workdir, done, rollouts)
            writer.write(done, metrics)
            history.append({"step": float(done), **metrics})
            if progress:
                print(f"rl step {done}/{total}: success {metrics['rl/success']:.3f} output_tokens {metrics['rl/output_tokens']:.1f}"
                      f" adv_std {metrics['rl/adv_std']:.3f} clip {metrics['rl/clip_frac']:.3f} gap {metrics['rl/logprob_gap']:.2e}", flush=True)
            if on_step is not None:
                on_step(done, metrics, state, engine)
            final = done == stop_at
            if checkpointer.due(done, force=final):
                # Async: the next step's rollouts (sampled with the weights before this step's update)
                # are part of the state; saving them keeps the resume exact.
                extra = {"competence": competence.to_dict(), "cursor": cursor.position, "weight_version": version,
                         "infra_dropped": dropped_total, "rl_step": done,
                         "prefetched": prefetched.to_dict() if prefetched is not None else None}
                checkpointer.save(done, state, jax.device_put(jnp.asarray([cursor.position, version], jnp.int32), replicated),
                                  force=final, extra=extra)
        checkpointer.wait()
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if writer is not None:
            writer.close()
        checkpointer.close()
    return RLResult(steps=stop_at, weight_version=version, history=history, checkpoint_dir=ck_dir,
                    metrics_path=os.path.join(workdir, "metrics.jsonl"), resumed_from=resumed_from)


@dataclasses.dataclass
class _Rollouts:
    """One step's verified rollouts (infra failures already retried or dropped)."""

    step: int
    tasks: list[Any]
    trajs: list[Any]
    groups: list[int]
    dropped: int
    rollout_s: float

    def staleness(self, learner_version: int) -> int:
        """Learner weight version minus the oldest version any of these rollouts sampled with."""
        used = [int(v) for t in self.trajs for v in (t.provenance.get("weight_versions") or [t.provenance.get("weight_version", 0)])]
        return learner_version - min(used) if used else 0

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tasks": [t.id for t in self.tasks], "trajs": [t.to_dict() for t in self.trajs],
                "groups": self.groups, "dropped": self.dropped, "rollout_s": self.rollout_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any], tasks: Sequence[Any]) -> "_Rollouts":
        from mpa_jax.envs.contract import Trajectory

        by_id = {t.id: t for t in tasks}
        return cls(int(d["step"]), [by_id[i] for i in d["tasks"]], [Trajectory.from_dict(t) for t in d["trajs"]],
                   [int(g) for g in d["groups"]], int(d["dropped"]), float(d["rollout_s"]))


def _collect(config, step, engine, tokenizer, cursor, env_factory, step_tasks=None) -> _Rollouts:
    t0 = time.perf_counter()
    if step_tasks is None:
        step_tasks = cursor.draw(int(config.rl.tasks_per_step))
    trajs, groups, dropped = run_group_rollouts(engine, tokenizer, step_tasks, config, step, env_factory)
    return _Rollouts(step, list(step_tasks), trajs, groups, dropped, time.perf_counter() - t0)


def _save_rollouts(workdir: str, step: int, rollouts: "_Rollouts") -> None:
    """The step's verified rollouts as `<workdir>/rollouts/step_NNNNNN.jsonl` (rewritten when a resumed run
    repeats the step): per-cell competence for the next round's data and failure traces for the harness."""
    from mpa_jax.envs.contract import write_jsonl

    out = os.path.join(workdir, "rollouts", f"step_{step:06d}.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_jsonl(out + ".tmp", rollouts.trajs)
    os.replace(out + ".tmp", out)


def _wait(future):
    return future.result() if future is not None else None


def _drop_stale(r: _Rollouts, version: int, max_staleness: int) -> int:
    """Drop rollouts sampled with weights more than `max_staleness` versions behind `version`."""
    keep = [i for i, t in enumerate(r.trajs)
            if version - min(int(v) for v in (t.provenance.get("weight_versions") or [version])) <= max_staleness]
    n = len(r.trajs) - len(keep)
    r.trajs, r.groups = [r.trajs[i] for i in keep], [r.groups[i] for i in keep]
    return n


def _one_step(config, step, state, engine, tokenizer, rollouts, competence, key_id, step_fn, ref_fn, ref_params,
              row_shard, dp, budget, seq_len, version, before_sync=None):
    rl = config.rl
    step_tasks, trajs, groups, dropped, t_roll = rollouts.tasks, rollouts.trajs, rollouts.groups, rollouts.dropped, rollouts.rollout_s

    t1 = time.perf_counter()
    keys = [step_tasks[g].template for g in groups]
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
        s, cut = rlbatch.sequence_from_trajectory(tr, float(a), seq_len)
        if cut:  # run_rl checks rl.seq_len >= rollout.max_total_tokens: an episode this long is a bug upstream
            raise ValueError(f"an episode of {len(tr.tokens)} tokens does not fit a row of config.rl.seq_len={seq_len}")
        if a != 0 and s.loss_mask[1:].sum() > 0:  # zero-advantage rollouts add no gradient (with kl_coef=0)
            seqs.append(s)
        elif float(rl.kl_coef) > 0 and s.loss_mask[1:].sum() > 0:
            seqs.append(s)
    update_metrics: list[dict[str, float]] = []
    layout = {"row_len": 0, "rows_per_device": 0, "micro_batches": 0}
    for epoch in range(int(rl.ppo_epochs)):
        rng = np.random.default_rng([int(config.seed), step, epoch])
        for idx in rlbatch.minibatches(len(seqs), int(rl.minibatches), rng) if seqs else []:
            micro, row_len, rpd = budgeted_micro_batches([seqs[i] for i in idx], seq_len, budget, dp)
            layout["row_len"] = max(layout["row_len"], row_len)
            layout["rows_per_device"] = max(layout["rows_per_device"], rpd)
            layout["micro_batches"] += len(micro)
            placed = []
            for mb in micro:
                b = {k: jax.device_put(v, row_shard) for k, v in mb.items()}
                if ref_fn is not None:
                    b["ref_logprobs"] = ref_fn(ref_params, b) * b["loss_weights"]
                placed.append(b)
            state, m = step_fn(state, placed)
            update_metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
    jax.block_until_ready(state.params)
    t_train = time.perf_counter() - t1

    if before_sync is not None:
        before_sync()  # async: the prefetch must not see a weight swap mid-generation
    t2 = time.perf_counter()
    if update_metrics:
        version += 1
        sync_weights(engine, state.params, version)
    t_sync = time.perf_counter() - t2

    first = update_metrics[0] if update_metrics else {}
    n_groups = len(step_tasks)
    zero_var = care.zero_variance_groups(np.asarray(groups), adv) + (n_groups - len(set(groups)))

    def upd(k: str) -> float:
        return _mean([u[k] for u in update_metrics if k in u])

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
        "rl/ratio_max": max((u["ratio_max"] for u in update_metrics), default=float("nan")),
        "rl/ratio_min": min((u["ratio_min"] for u in update_metrics), default=float("nan")),
        "rl/logprob_gap": first.get("logprob_gap", float("nan")),
        "rl/loss": upd("loss"),
        "rl/grad_norm": upd("grad_norm"),
        "rl/lr": first.get("lr", float("nan")),
        "rl/updates": float(len(update_metrics)),
        "rl/train_tokens": float(sum(u["tokens"] for u in update_metrics)),
        "rl/rollouts": float(len(trajs)),
        "rl/row_len": float(layout["row_len"]),
        "rl/rows_per_device": float(layout["rows_per_device"]),
        "rl/micro_batches": float(layout["micro_batches"]),
        "rl/weight_version": float(version),
        "rl/infra_dropped": float(dropped),
        "time/rollout_s": t_roll,
        "time/train_s": t_train,
        "time/sync_s": t_sync,
    }
    return metrics, state, version, dropped
