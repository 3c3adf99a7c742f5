"""`run_sft`: the supervised planning cold start, from a config and a Trajectory file.

Mesh from `config.mesh`, parameters sharded by `config.sharding_rules`, batch rows over the
data-parallel axes. One jitted step per optimizer update (micro-batches accumulated inside it).
Checkpoints (params, optimizer, step, rng and the data position) every `config.checkpoint.every` steps;
a run whose directory already holds a checkpoint resumes from the latest complete one.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from mpa_jax import models, sharding
from mpa_jax.sft import data as sft_data
from mpa_jax.sft.loss import make_sft_loss
from mpa_jax.train import checkpoint as ckpt
from mpa_jax.train.compiled import compile_cache
from mpa_jax.train import metrics as mlib
from mpa_jax.train import optimizer as optlib
from mpa_jax.train import state as statelib
from mpa_jax.train import step as steplib
from mpa_jax.train.preemption import Interrupted, Preemption
from mpa_jax.train.progress import Progress


@dataclasses.dataclass
class SFTResult:
    """What a finished SFT run produced."""

    steps: int  # optimizer steps done in total (including those before a resume)
    final_metrics: dict[str, Any]  # the last logged train record
    train_loss: float  # token-weighted loss over the last `log_every` steps
    eval_loss: float | None  # held-out loss at the end (None without held-out data)
    unigram_loss: float  # loss of the best unigram model of the training targets: the baseline to beat
    checkpoint_dir: str
    metrics_path: str
    export_dir: str | None = None
    resumed_from: int | None = None
    losses: list[float] = dataclasses.field(default_factory=list)  # per logged step, this process' run only
    local_rows: list[int] = dataclasses.field(default_factory=list)  # batch rows (data streams) this process read


def unigram_loss(data: sft_data.SFTData, vocab_size: int) -> float:
    """Cross-entropy of the best unigram model on the (local) training targets: -sum p log p."""
    counts = np.zeros(vocab_size, np.float64)
    for stream in data.train.streams.values():
        for ex in stream.examples:
            np.add.at(counts, ex.tokens[1:][ex.mask[1:] > 0], 1.0)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _global_batch(rows: Mapping[int, Mapping[str, np.ndarray]], shard: NamedSharding, num_rows: int, seq_len: int) -> dict[str, jax.Array]:
    """Assemble the global [B, T] arrays from the rows this process holds."""
    out = {}
    for key in sft_data.FIELDS:

        def cb(index, key=key):
            ids = range(*index[0].indices(num_rows))
            return np.stack([rows[r][key] for r in ids])[:, index[1]]

        out[key] = jax.make_array_from_callback((num_rows, seq_len), shard, cb)
    return out


def _positions_array(positions: Mapping[int, tuple[int, int]], shard: NamedSharding, num_rows: int) -> jax.Array:
    def cb(index):
        ids = range(*index[0].indices(num_rows))
        return np.asarray([positions[r] for r in ids], np.int32).reshape(-1, 2)[:, index[1]]

    return jax.make_array_from_callback((num_rows, 2), shard, cb)


def _local_rows(shard: NamedSharding, num_rows: int, seq_len: int) -> list[int]:
    rows: set[int] = set()
    for index in shard.addressable_devices_indices_map((num_rows, seq_len)).values():
        rows.update(range(*index[0].indices(num_rows)))
    return sorted(rows)


def _last_good(checkpointer: Any, ck_dir: str) -> str:
    step = checkpointer.latest_step()
    return "none written yet" if step is None else f"step {step} in {ck_dir}"


class SFTDiverged(RuntimeError):
    """`sft.max_bad_updates` steps in a row had a non-finite loss or gradient norm; the last good checkpoint is kept."""


def _window_mean(window: list[Mapping[str, jax.Array]]) -> tuple[dict[str, float], list[bool]]:
    """Metrics over the steps since the last log (token-weighted loss, mean grad norm, last lr; the finite
    steps only, and how many were not) and each step's non-finite flag."""
    host = [{k: float(v) for k, v in jax.device_get(dict(m)).items()} for m in window]
    bad = [h["nonfinite"] > 0 for h in host]
    good = [h for h, b in zip(host, bad) if not b] or host
    loss_sum = sum(h["loss_sum"] for h in good)
    tokens = sum(h["tokens"] for h in good)
    return {
        "loss": loss_sum / max(tokens, 1.0),
        "loss_sum": loss_sum,
        "tokens": tokens,
        "grad_norm": sum(h["grad_norm"] for h in good) / len(good),
        "lr": host[-1]["lr"],
        "steps_in_window": float(len(host)),
        "nonfinite_steps": float(sum(bad)),
    }, bad


def run_sft(
    config: Any,
    workdir: str,
    data_path: str | None = None,
    *,
    export: bool | None = None,
    max_steps: int | None = None,
    on_save_started: Callable[[int], None] | None = None,
    on_eval: Callable[[int, Any], Mapping[str, float]] | None = None,
    progress: bool = True,
) -> SFTResult:
    """Train `config.model` on the Trajectory file `data_path` (default `config.sft.data`) into `workdir`.

    Resumes from `<workdir>/checkpoints` when it holds a checkpoint. `max_steps` stops early (the
    schedule still follows `config.sft.steps`); `on_save_started(step)` is called when an async save
    has been started (tests use it to kill a run mid-save). `on_eval(step, params)` runs at every eval
    point and at the end and returns extra metrics logged under `eval/` (e.g. task success on a dev
    split through the agent loop). With `export` (default
    `config.sft.export`), the final parameters are also written as a Hugging Face directory
    `<workdir>/hf`.

    SIGINT / SIGTERM while starting up stop at once (nothing is trained yet); from the first step on they save
    a checkpoint at the next step boundary and raise `train.preemption.Interrupted` (a SystemExit, code 130)
    after printing one line; a second signal exits at once.
    """
    with Preemption(armed=False) as pre:
        return _run_sft(config, workdir, data_path, pre, export=export, max_steps=max_steps, on_save_started=on_save_started,
                        on_eval=on_eval, progress=progress)


def _run_sft(config: Any, workdir: str, data_path: str | None, pre: Preemption, *, export: bool | None, max_steps: int | None,
             on_save_started: Callable[[int], None] | None, on_eval: Callable[[int, Any], Mapping[str, float]] | None,
             progress: bool) -> SFTResult:
    """The body of `run_sft`, with its signal handling in `pre`."""
    sft = config.sft
    data_path = data_path or str(sft.data or "")
    if not data_path:
        raise ValueError("no SFT data: pass a trajectory file (config.sft.data)")
    total_steps = int(sft.steps)
    stop_at = total_steps if max_steps is None else min(int(max_steps), total_steps)
    export = bool(sft.export) if export is None else export
    num_rows, seq_len, micro = int(sft.batch_size), int(sft.seq_len), int(sft.micro_batches)
    if micro <= 0 or num_rows % micro:
        raise ValueError(f"sft.batch_size={num_rows} must be a positive multiple of sft.micro_batches={micro}")
    is_main = jax.process_index() == 0
    prog = Progress("sft", stop_at, section=config.progress, enabled=progress and is_main)

    cfg, init_from = models.run_model_config(config)
    rules = sharding.rules_from_config(config)
    mesh = sharding.make_learner_mesh(config.mesh)
    row_shard = sharding.batch_sharding(mesh, rules, 2)
    dp = math.prod(mesh.shape[a] for a in _spec_axes(row_shard))
    if (num_rows // micro) % dp:
        raise ValueError(
            f"sft.batch_size={num_rows} / sft.micro_batches={micro} rows do not divide over the mesh's {dp}"
            f" data-parallel devices ({sharding.describe(mesh)})"
        )

    with prog.phase(f"building the data from {data_path}"):
        data = sft_data.load_sft_data(
            data_path,
            seq_len=seq_len,
            num_rows=num_rows,
            local_rows=_local_rows(row_shard, num_rows, seq_len),
            seed=int(config.seed),
            eval_fraction=float(sft.eval_fraction),
            only_success=bool(sft.only_success),
        )
    report = data_report(data.stats, seq_len, bool(sft.only_success))
    if report:
        prog.log(f"sft: {report}")
    optimizer, _ = optlib.optimizer_from_config(sft)
    p_shardings = sharding.param_shardings(cfg, mesh, rules)
    family = models.registry.family_module(cfg.family)
    params_shape = cfg.abstract_params()
    st_shardings = statelib.state_shardings(mesh, params_shape, p_shardings, optimizer)

    meta = {
        "model": cfg.to_hf(),
        "data": {"fingerprint": data.fingerprint, "seed": int(config.seed), "seq_len": seq_len, "rows": num_rows,
                 "eval_fraction": float(sft.eval_fraction), "only_success": bool(sft.only_success)},
    }
    ck_dir = os.path.join(workdir, "checkpoints")
    checkpointer = ckpt.Checkpointer(
        ck_dir, every=int(config.checkpoint.every), keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save), meta=meta,
    )
    try:
        latest = checkpointer.latest_step()
        resumed_from = None
        if latest is not None:
            with prog.phase(f"restoring checkpoint step {latest} from {ck_dir}"):
                abstract = statelib.abstract_state(params_shape, optimizer, st_shardings)
                abstract_pos = jax.ShapeDtypeStruct((num_rows, 2), jnp.int32, sharding=row_shard)
                state, pos = checkpointer.restore(latest, abstract, abstract_pos)
                data.train.set_positions({r: tuple(int(x) for x in v) for r, v in ckpt.local_rows(pos).items()})
            resumed_from = latest
        elif init_from:
            with prog.phase(f"loading the weights of {init_from}"):
                params = models.hf_io.load_params(init_from, cfg, mesh, rules)
                state = statelib.state_from_params(params, optimizer, int(config.seed), st_shardings)
        else:
            with prog.phase("initialising the parameters"):
                state = statelib.create_sharded_state(lambda r: family.init_params(cfg, r), optimizer, int(config.seed), st_shardings)
        start = int(jax.device_get(state.step))
        if start >= stop_at:
            return _already_complete(config, workdir, data, start, stop_at, resumed_from, ck_dir, export, prog)

        step_fn, eval_fn = _compiled_fns(cfg, int(config.model.logprob_chunk), _opt_key(sft), micro, mesh, rules)
        eval_batches = [_global_batch(b, row_shard, num_rows, seq_len) for b in data.eval_batches(int(sft.eval_batches))] if data.has_eval else []

        def evaluate(params: Any) -> float | None:
            if not eval_batches:
                return None
            tot, cnt = 0.0, 0.0
            for b in eval_batches:
                s, c = eval_fn(params, b)
                tot, cnt = tot + float(s), cnt + float(c)
            return tot / max(cnt, 1.0)

        # A resumed run rewrites the steps after its checkpoint: the JSONL and TensorBoard drop the old ones.
        writer = mlib.MetricsWriter(workdir, keep_through=-1 if resumed_from is None else resumed_from)
        n_params = statelib.param_count(params_shape)
        flops_tok = mlib.train_flops_per_token(n_params, cfg.num_hidden_layers, seq_len, cfg.num_attention_heads * cfg.head_dim)
        peak = mlib.peak_flops_per_device(override=float(sft.peak_flops))
        baseline = unigram_loss(data, cfg.vocab_size)
        if is_main and resumed_from is None:
            writer.write(0, {"unigram_loss": baseline, "params": float(n_params), "train_examples": float(data.stats.train_lines),
                             "truncated": float(data.stats.truncated), "dropped": float(_dropped(data.stats))},
                         prefix="data/")

        log_every, eval_every = max(1, int(sft.log_every)), int(sft.eval_every)
        last: dict[str, Any] = {}
        losses: list[float] = []
        window_tokens, window_t0 = 0.0, time.perf_counter()
        window: list[Mapping[str, jax.Array]] = []
        bad_streak, max_bad = 0, int(sft.max_bad_updates)
        prog.set_start(start)
        pre.arm()
        interrupted: tuple[str, int | None] | None = None
        try:
            for step in range(start, stop_at):
                if _stop_requested(pre):
                    interrupted = _interrupt(pre, checkpointer, step, step > start, state, data, row_shard, num_rows, ck_dir,
                                             writer, window, prog)
                    break
                rows = data.train.next_local()
                batch = _global_batch(rows, row_shard, num_rows, seq_len)
                real = sum(int((r["segment_ids"] > 0).sum()) for r in rows.values()) * jax.process_count()
                if step == start:  # the first call compiles: name it while it runs, and keep it out of the rate
                    with prog.phase(f"compiling the train step (and running step {start + 1})"):
                        state, m = step_fn(state, batch)
                        jax.block_until_ready(m)
                    window_t0 = time.perf_counter()
                else:
                    state, m = step_fn(state, batch)
                window.append(m)  # device arrays: no host sync until the log step
                window_tokens += real
                done = step + 1
                if done % log_every == 0 or done == stop_at:
                    vals, flags = _window_mean(window)
                    window = []
                    for flag in flags:  # a non-finite step left the weights as they were (train.step)
                        bad_streak = bad_streak + 1 if flag else 0
                        if bad_streak >= max_bad:
                            writer.write(done, vals, prefix="train/")
                            raise SFTDiverged(f"{bad_streak} SFT steps in a row had a non-finite loss, gradient norm or update "
                                              f"(config.sft.max_bad_updates={max_bad}); stopped at step {done}; last good "
                                              f"checkpoint: {_last_good(checkpointer, ck_dir)}")
                    elapsed = max(time.perf_counter() - window_t0, 1e-9)
                    tps = window_tokens / elapsed
                    # tokens_per_s counts every packed token (the step's work); tokens counts the trained ones
                    vals.update(tokens_per_s=tps, row_tokens=window_tokens, seconds=elapsed,
                                mfu=mlib.mfu(tps, flops_tok, jax.device_count(), peak))
                    window_tokens, window_t0 = 0.0, time.perf_counter()
                    writer.write(done, vals, prefix="train/")
                    last = {"step": done, **vals}
                    losses.append(vals["loss"])
                    prog.update(done, loss=vals["loss"])
                else:
                    prog.update(done)
                if eval_every > 0 and done % eval_every == 0 and done != stop_at:
                    eval_t0 = time.perf_counter()
                    ev = evaluate(state.params)
                    extra = dict(on_eval(done, state.params)) if on_eval is not None else {}
                    if ev is not None or extra:
                        writer.write(done, {**({"loss": ev} if ev is not None else {}), **extra}, prefix="eval/")
                    window_t0 += time.perf_counter() - eval_t0  # train windows time training, not evaluations
                final = done == stop_at
                if checkpointer.due(done, force=final) and not float(jax.device_get(m["nonfinite"])):
                    if checkpointer.save(done, state, _positions_array(data.train.positions(), row_shard, num_rows), force=final):
                        if on_save_started is not None:
                            on_save_started(done)
            if interrupted is None:
                eval_loss = evaluate(state.params)
                extra = dict(on_eval(stop_at, state.params)) if on_eval is not None else {}
                if eval_loss is not None or extra:
                    writer.write(stop_at, {**({"loss": eval_loss} if eval_loss is not None else {}), **extra}, prefix="eval/")
            checkpointer.wait()
        finally:
            prog.close()
            writer.close()
    finally:
        checkpointer.close()  # also on errors: no orbax threads left behind
    if interrupted is not None:
        if is_main:
            print(interrupted[0], file=sys.stderr, flush=True)
        raise Interrupted(*interrupted)

    export_dir = None
    if export:
        from mpa_jax.export import export_checkpoint

        with prog.phase(f"exporting the Hugging Face model to {os.path.join(workdir, 'hf')}"):
            export_dir = export_checkpoint(ck_dir, os.path.join(workdir, "hf"), dtype=str(sft.export_dtype),
                                           tokenizer_dir=_tokenizer_dir(config, workdir))
    return SFTResult(
        steps=stop_at,
        final_metrics=last,
        train_loss=float(last["loss"]) if last else float("nan"),
        eval_loss=eval_loss,
        unigram_loss=baseline,
        checkpoint_dir=ck_dir,
        metrics_path=writer.path,
        export_dir=export_dir,
        resumed_from=resumed_from,
        losses=losses,
        local_rows=sorted(data.train.streams),
    )


def _dropped(stats: sft_data.DataStats) -> int:
    return stats.dropped_infra + stats.dropped_failed + stats.dropped_no_loss


def data_report(stats: sft_data.DataStats, seq_len: int, only_success: bool) -> str:
    """One line on the examples loading truncated or dropped, with the reasons ("" when none were)."""
    parts = []
    if stats.truncated:
        parts.append(f"{stats.truncated} truncated to sft.seq_len={seq_len} tokens (their tails are not trained;"
                     " raise config.sft.seq_len to keep them)")
    reasons = [(stats.dropped_infra, "infra failures"),
               (stats.dropped_failed, "unsuccessful episodes (config.sft.only_success=True)" if only_success else "unsuccessful episodes"),
               (stats.dropped_no_loss, f"no trained token within the first {seq_len} tokens")]
    if _dropped(stats):
        parts.append(f"{_dropped(stats)} dropped (" + ", ".join(f"{n} {why}" for n, why in reasons if n) + ")")
    if not parts:
        return ""
    return f"data: of {stats.train_lines + stats.eval_lines} examples, " + "; ".join(parts)


def _stop_requested(pre: Preemption) -> bool:
    """Whether any process got a stop signal (all processes must agree: the save is collective)."""
    flag = pre.requested
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        flag = bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())
    return flag


def _interrupt(pre: Preemption, checkpointer: Any, step: int, trained: bool, state: Any, data: sft_data.SFTData,
               row_shard: NamedSharding, num_rows: int, ck_dir: str, writer: mlib.MetricsWriter,
               window: list[Mapping[str, jax.Array]], prog: Progress) -> tuple[str, int | None]:
    """Save `step` (the last finished one) for a signal; returns the one line to print and the step saved."""
    if not trained:
        return (f"interrupted ({pre.signal_name}) before a step ran: nothing new to save; run the same command again to resume",
                checkpointer.latest_step())
    if window:  # the steps since the last log line: logged now, or the resumed run would never log them
        vals, _ = _window_mean(window)
        writer.write(step, vals, prefix="train/")
    with prog.phase(f"saving step {step} before exiting"):
        checkpointer.save(step, state, _positions_array(data.train.positions(), row_shard, num_rows), force=True)
        checkpointer.wait()
    return pre.message(step, ck_dir), step


def _already_complete(config: Any, workdir: str, data: sft_data.SFTData, start: int, stop_at: int, resumed_from: int | None,
                      ck_dir: str, export: bool, prog: Progress) -> SFTResult:
    """A run whose checkpoint is already at `stop_at`: say so, and report its logged losses instead of training."""
    prog.log(f"sft: already complete: {ck_dir} holds step {start} of {stop_at}; nothing to train "
             "(raise config.sft.steps or --max-steps to train further)")
    path = os.path.join(workdir, "metrics.jsonl")
    records = mlib.read_metrics(path) if os.path.exists(path) else []
    train = [r for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    export_dir = None
    if export:
        from mpa_jax.export import export_checkpoint

        export_dir = export_checkpoint(ck_dir, os.path.join(workdir, "hf"), dtype=str(config.sft.export_dtype),
                                       tokenizer_dir=_tokenizer_dir(config, workdir))
    cfg_vocab = models.run_model_config(config)[0].vocab_size
    return SFTResult(
        steps=start,
        final_metrics={k[len("train/"):] if k.startswith("train/") else k: v for k, v in train[-1].items()} if train else {},
        train_loss=float(train[-1]["train/loss"]) if train else float("nan"),
        eval_loss=float(evals[-1]["eval/loss"]) if evals else None,
        unigram_loss=unigram_loss(data, cfg_vocab),
        checkpoint_dir=ck_dir,
        metrics_path=path,
        export_dir=export_dir,
        resumed_from=resumed_from,
        local_rows=sorted(data.train.streams),
    )


def _opt_key(sft: Any) -> tuple:
    """The optimizer settings as a hashable key (what `optimizer_from_config` reads)."""
    return tuple((k, sft[k]) for k in ("lr", "warmup_steps", "steps", "weight_decay", "clip_norm", "b1", "b2", "lr_end_ratio"))


@compile_cache
def _compiled_fns(cfg: models.ModelConfig, chunk: int, opt_key: tuple, micro: int, mesh: Any, rules: tuple) -> tuple[Callable, Callable]:
    """The jitted train and eval steps for one (model, optimizer, mesh) setting (in the one compile cache,
    `mpa_jax.train.compiled`)."""
    import ml_collections

    optimizer, schedule = optlib.optimizer_from_config(ml_collections.ConfigDict({k: v for k, v in opt_key if v is not None}))
    p_shardings = sharding.param_shardings(cfg, mesh, rules)
    st_shardings = statelib.state_shardings(mesh, cfg.abstract_params(), p_shardings, optimizer)
    row_shard = sharding.batch_sharding(mesh, rules, 2)
    batch_sh = {k: row_shard for k in sft_data.FIELDS}
    loss_fn = make_sft_loss(cfg, chunk, mesh=mesh, rules=rules)  # activation constraints + vocab-parallel log-probs
    step_fn = steplib.make_train_step(loss_fn, optimizer, st_shardings, batch_sh, schedule=schedule, micro_batches=micro)
    return step_fn, steplib.make_eval_step(loss_fn, p_shardings, batch_sh)


def compiled_steps(cfg: models.ModelConfig, sft: Any, chunk: int, mesh: Any, rules: tuple, micro: int = 1) -> tuple[Callable, Callable]:
    """The (cached) jitted train and eval steps `run_sft` uses for this model, `config.sft` section and mesh
    (for callers that lower or inspect the step: the memory plan's and the HLO sharding tests)."""
    return _compiled_fns(cfg, chunk, _opt_key(sft), micro, mesh, rules)


def _spec_axes(shard: NamedSharding) -> tuple[str, ...]:
    first = shard.spec[0] if len(shard.spec) else None
    if first is None:
        return ()
    return (first,) if isinstance(first, str) else tuple(first)


def _tokenizer_dir(config: Any, workdir: str) -> str | None:
    """The tokenizer directory to ship with an export: the run's own (tokenizer.path, the init_from
    checkpoint's, or the project BPE in <workdir>/tokenizer; see `tokenizer.select`)."""
    from mpa_jax.tokenizer import tokenizer_dir_for_config

    cand = tokenizer_dir_for_config(config, workdir)
    return cand if cand and os.path.isdir(cand) else None
