"""Host memory of one RL update: the token-budgeted layout (`rl.update`) vs the former one (one micro-batch
of rows of `rl.seq_len` tokens), same rollouts, same model. Run one layout per process (peak RSS is a
process figure):

    python bench/rl_memory.py --config configs/tiny.py --layout budget [--episodes 64 --min-len 900 --max-len 1700]
    python bench/rl_memory.py --config configs/tiny.py --layout seq_len --analyse-only

Episodes are synthetic token sequences of lengths drawn uniformly in [min_len, max_len] (half of each
is "sampled", i.e. in the loss), with random advantages: the update's memory depends only on their
lengths. Prints the layout (row length, rows per micro-batch, micro-batches), XLA's memory analysis of
the largest compiled piece (temporaries + arguments + outputs, no execution needed), and, unless
`--analyse-only`, the wall time of the update and the process' peak RSS (getrusage) before and after
it. A layout whose analysed size is above `--max-gb` is not executed (it would take the shared host down).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _analysed_gib(compiled) -> float:
    m = compiled.memory_analysis()
    if m is None:
        return float("nan")
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes) / 2**30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "configs/tiny.py"))
    p.add_argument("--layout", choices=("budget", "seq_len"), default="budget")
    p.add_argument("--episodes", type=int, default=64, help="rollouts in the update (tasks_per_step x group_size)")
    p.add_argument("--min-len", type=int, default=900)
    p.add_argument("--max-len", type=int, default=1700)
    p.add_argument("--analyse-only", action="store_true")
    p.add_argument("--max-gb", type=float, default=5.0)
    p.add_argument("--budget", type=int, default=None, help="override config.rl.tokens_per_micro_batch")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    from mpa_jax import models, sharding
    from mpa_jax.config import load_config_file
    from mpa_jax.rl import batch as rlbatch
    from mpa_jax.rl.loss import make_rl_loss
    from mpa_jax.rl.learner import budgeted_micro_batches, compiled_update, make_rl_optimizer, optimizer_key
    from mpa_jax.train import state as statelib
    from mpa_jax.train import step as steplib

    config = load_config_file(args.config)
    rl = config.rl
    cfg = models.config_from_ml(config.model)
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.rules_from_config(config)
    dp = int(np.prod([mesh.shape[a] for a in ("data", "fsdp")]))
    row_sh = sharding.batch_sharding(mesh, rules, 2)
    fam = models.registry.family_module(cfg.family)
    opt, sched = make_rl_optimizer(rl, 100)
    pshape = jax.eval_shape(lambda r: fam.init_params(cfg, r), jax.random.key(0))
    ssh = statelib.state_shardings(mesh, pshape, sharding.param_shardings(cfg, mesh, rules), opt)
    state = statelib.create_sharded_state(lambda r: fam.init_params(cfg, r), opt, 0, ssh)
    rng = np.random.default_rng(0)
    seqs = []
    for _ in range(args.episodes):
        n = int(rng.integers(args.min_len, args.max_len + 1))
        mask = np.r_[np.zeros(n - n // 2), np.ones(n // 2)].astype(np.float32)
        seqs.append(rlbatch.RLSequence(rng.integers(10, cfg.vocab_size, n).astype(np.int32), mask,
                                       (-2.0 * mask).astype(np.float32), float(rng.normal())))
    seq_len = int(rl.seq_len)
    chunk = int(config.model.logprob_chunk)
    print(f"{args.config}: {cfg.num_hidden_layers} layers x {cfg.hidden_size}, {mesh.size} device(s); {args.episodes} episodes of"
          f" {args.min_len}-{args.max_len} tokens ({sum(len(s.tokens) for s in seqs)} in all); layout {args.layout}", flush=True)
    if args.layout == "budget":
        budget = int(args.budget or rl.tokens_per_micro_batch)
        micro, row_len, rpd = budgeted_micro_batches(seqs, seq_len, budget, dp)
        upd = compiled_update(cfg, (float(rl.temperature), float(rl.clip_low), float(rl.clip_high), 0.0, chunk, None),
                             optimizer_key(rl, 100), mesh, rules)
        placed = [{k: jax.device_put(v, row_sh) for k, v in mb.items()} for mb in micro]
        acc = upd._init_acc(state.params, placed[0])
        gib = _analysed_gib(upd._accumulate.lower(acc, state.params, placed[0]).compile())
        print(f"rows of {row_len} tokens, {rpd} row(s) per device per micro-batch (budget {budget} tokens), {len(micro)} micro-batch(es);"
              f" XLA analysis of one micro-batch: {gib:.2f} GiB", flush=True)
        run = lambda s: upd(s, placed)  # noqa: E731
    else:
        packed = rlbatch.pack(seqs, seq_len, min_rows=dp, row_multiple=dp)
        batch = {k: jax.device_put(v, row_sh) for k, v in packed.items()}
        loss_fn = make_rl_loss(cfg, temperature=float(rl.temperature), clip_low=float(rl.clip_low), clip_high=float(rl.clip_high),
                               chunk=chunk)
        from mpa_jax.rl.loss import FIELDS

        step = steplib.make_train_step(loss_fn, opt, ssh, {k: row_sh for k in FIELDS}, schedule=sched, micro_batches=1)
        gib = _analysed_gib(step.lower(state, batch).compile())
        print(f"rows of {seq_len} tokens, {packed['input_ids'].shape[0]} rows in one micro-batch; XLA analysis: {gib:.2f} GiB", flush=True)
        run = lambda s: step(s, batch)  # noqa: E731
    if args.analyse_only:
        return 0
    if gib > args.max_gb:
        print(f"not executed: the analysis says {gib:.1f} GiB > --max-gb {args.max_gb}")
        return 0
    before = _rss_gib()
    t0 = time.perf_counter()
    state, m = run(state)
    jax.block_until_ready(state.params)
    t1 = time.perf_counter()
    state, m = run(state)  # compiled: the second update is the steady state
    jax.block_until_ready(state.params)
    t2 = time.perf_counter()
    print(f"update: first {t1 - t0:.1f} s (compiles), second {t2 - t1:.1f} s; tokens {float(m['tokens']):.0f};"
          f" peak RSS before the update {before:.2f} GiB, after {_rss_gib():.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
