"""The RL learner: train state on the learner mesh, the frozen reference, and `update(sequences)`.

    learner = Learner(config.rl, model_cfg, init_params, mesh=config.mesh, rules=rules, seed=config.seed,
                      logprob_chunk=config.model.logprob_chunk, vocab_limit=v, total_updates=n)
    learner.state                                                # restored by the trainer for an exact resume
    report = learner.update(trajectories, advantages, step)      # rl.ppo_epochs x rl.minibatches updates

`update` turns the rollouts into sequences (a rollout with advantage 0 adds no gradient and is left out unless
a KL term pulls it towards the reference), packs them (rows sized to the longest episode, micro-batches under the token budget:
`rl/update.py`), adds the reference log-probs when `rl.kl_coef` > 0, and runs the jitted, donated update per
minibatch; the minibatch shuffle is a function of (seed, step, epoch). An update whose loss or gradient
norm is not finite leaves the weights as they were (`train.step.apply_gradients`) and reports
`nonfinite` = 1: the trainer counts them (`rl.max_bad_updates` in a row stop the run).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mpa_jax import models, sharding
from mpa_jax.rl import batch as rlbatch
from mpa_jax.rl import update as rlupdate
from mpa_jax.rl.loss import make_rl_loss, policy_logprobs
from mpa_jax.rl.errors import RLSetupError
from mpa_jax.train import optimizer as optlib
from mpa_jax.train.compiled import compile_cache
from mpa_jax.train import state as statelib

OPTIMIZER_KEYS = ("optimizer", "lr", "warmup_steps", "weight_decay", "clip_norm", "b1", "b2", "lr_end_ratio")


def make_rl_optimizer(rl: Any, total_updates: int):
    return optlib.make_optimizer(
        lr=float(rl.lr), warmup_steps=int(rl.warmup_steps), total_steps=max(1, int(total_updates)),
        weight_decay=float(rl.weight_decay), clip_norm=float(rl.clip_norm), b1=float(rl.b1), b2=float(rl.b2),
        end_ratio=float(rl.lr_end_ratio), kind=str(rl.optimizer),
    )


def optimizer_key(rl: Any, total_updates: int) -> tuple:
    """The optimizer settings of `rl` as a hashable key (`compiled_update`'s cache key)."""
    return tuple((k, rl[k]) for k in OPTIMIZER_KEYS) + (("total", int(total_updates)),)


@compile_cache
def compiled_update(cfg: models.ModelConfig, loss_key: tuple, opt_key: tuple, mesh: Any, rules: tuple) -> rlupdate.BudgetedUpdate:
    """The RL update (jitted accumulate/apply pieces) for one (model, loss, optimizer, mesh) setting, in the one
    compile cache (`mpa_jax.train.compiled`): repeated runs in one process reuse the compiled executables."""
    import ml_collections

    temperature, clip_low, clip_high, kl_coef, chunk, vocab_limit = loss_key
    d = dict(opt_key)
    optimizer, schedule = make_rl_optimizer(ml_collections.ConfigDict({k: v for k, v in d.items() if k != "total"}), d["total"])
    st_shardings = statelib.state_shardings(mesh, cfg.abstract_params(), sharding.param_shardings(cfg, mesh, rules), optimizer)
    loss_fn = make_rl_loss(cfg, temperature=temperature, clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef,
                           chunk=chunk, vocab_limit=vocab_limit)
    return rlupdate.BudgetedUpdate(loss_fn, optimizer, schedule, st_shardings, sharding.batch_sharding(mesh, rules, 2))


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


@dataclasses.dataclass
class UpdateReport:
    """What one step's `update` did: the per-optimizer-update metrics, the row layout and the sequences trained on."""

    updates: list[dict[str, float]]
    layout: dict[str, int]
    sequences: int

    @property
    def nonfinite(self) -> int:
        return sum(int(u.get("nonfinite", 0.0) > 0) for u in self.updates)

    @property
    def changed(self) -> bool:
        """Whether the weights moved (some update was finite): the sampler needs a sync."""
        return len(self.updates) > self.nonfinite


class Learner:
    """The learner role of the RL loop (see the module docstring). `rl`: the `config.rl` section; `mesh`: the
    `config.mesh` section; `rules`: the sharding rules (`sharding.rules_from_config`)."""

    def __init__(self, rl: Any, cfg: models.ModelConfig, init_params: Any, *, mesh: Any, rules: tuple, seed: int, logprob_chunk: int,
                 vocab_limit: int | None, total_updates: int) -> None:
        self.cfg, self.seed = cfg, int(seed)
        self.seq_len, self.budget = int(rl.seq_len), int(rl.tokens_per_micro_batch)
        try:
            rlupdate.check_budget(self.seq_len, self.budget)
        except ValueError as e:
            raise RLSetupError(str(e)) from None
        self.ppo_epochs, self.minibatches = int(rl.ppo_epochs), int(rl.minibatches)
        self.kl_coef = float(rl.kl_coef)
        self.mesh = sharding.make_learner_mesh(mesh)
        self.rules = tuple(rules)
        self.row_shard = sharding.batch_sharding(self.mesh, self.rules, 2)
        self.replicated = NamedSharding(self.mesh, P())
        self.dp = math.prod(self.mesh.shape[a] for a in ("data", "fsdp") if a in self.mesh.shape)
        self.optimizer, _ = make_rl_optimizer(rl, total_updates)
        self.st_shardings = statelib.state_shardings(self.mesh, cfg.abstract_params(), sharding.param_shardings(cfg, self.mesh, self.rules),
                                                     self.optimizer)
        chunk = int(logprob_chunk)
        temperature = float(rl.temperature)
        self._update = compiled_update(cfg, (temperature, float(rl.clip_low), float(rl.clip_high), self.kl_coef, chunk, vocab_limit),
                                       optimizer_key(rl, total_updates), self.mesh, self.rules)
        self._init_params = init_params
        self.state = self._fresh_state()
        self.ref_params = None
        self._ref_fn = None
        if self.kl_coef > 0:
            # the frozen reference: the init weights (random init is reproducible from the seed)
            self.ref_params = self._fresh_state().params
            self._ref_fn = jax.jit(lambda p, b: policy_logprobs(cfg, p, b, temperature=temperature, chunk=chunk,
                                                                vocab_limit=vocab_limit)[0])

    def _fresh_state(self) -> Any:
        if self._init_params is None:
            family = models.registry.family_module(self.cfg.family)
            return statelib.create_sharded_state(lambda r: family.init_params(self.cfg, r), self.optimizer, self.seed, self.st_shardings)
        return statelib.state_from_params(self._init_params, self.optimizer, self.seed, self.st_shardings)

    @property
    def params(self) -> Any:
        return self.state.params

    def abstract_state(self) -> Any:
        return statelib.abstract_state(self.cfg.abstract_params(), self.optimizer, self.st_shardings)

    def update(self, trajectories: Sequence[Any], advantages: Sequence[float], step: int) -> UpdateReport:
        """One step's optimizer updates over `trajectories` with their `advantages` (module docstring)."""
        seqs = []
        for tr, a in zip(trajectories, advantages):
            s, cut = rlbatch.sequence_from_trajectory(tr, float(a), self.seq_len)
            if cut:  # run_rl checks rl.seq_len >= rollout.max_total_tokens: an episode this long is a bug upstream
                raise ValueError(f"an episode of {len(tr.tokens)} tokens does not fit a row of config.rl.seq_len={self.seq_len}")
            if s.loss_mask[1:].sum() > 0 and (a != 0 or self.kl_coef > 0):
                seqs.append(s)
        updates, layout = self.update_sequences(seqs, step)
        return UpdateReport(updates, layout, len(seqs))

    def update_sequences(self, seqs: Sequence[rlbatch.RLSequence], step: int) -> tuple[list[dict[str, float]], dict[str, int]]:
        """`ppo_epochs` x `minibatches` optimizer updates over `seqs`; (per-update metrics, layout)."""
        metrics: list[dict[str, float]] = []
        layout = {"row_len": 0, "rows_per_device": 0, "micro_batches": 0}
        for epoch in range(self.ppo_epochs):
            rng = np.random.default_rng([self.seed, int(step), epoch])
            for idx in rlbatch.minibatches(len(seqs), self.minibatches, rng) if seqs else []:
                micro, row_len, rpd = budgeted_micro_batches([seqs[i] for i in idx], self.seq_len, self.budget, self.dp)
                layout["row_len"] = max(layout["row_len"], row_len)
                layout["rows_per_device"] = max(layout["rows_per_device"], rpd)
                layout["micro_batches"] += len(micro)
                placed = []
                for mb in micro:
                    b = {k: jax.device_put(v, self.row_shard) for k, v in mb.items()}
                    if self._ref_fn is not None:
                        b["ref_logprobs"] = self._ref_fn(self.ref_params, b) * b["loss_weights"]
                    placed.append(b)
                self.state, m = self._update(self.state, placed)
                metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
        jax.block_until_ready(self.state.params)
        return metrics, layout

    def cursor_array(self, *values: int) -> jax.Array:
        """Small host state saved as a replicated array beside the train state."""
        return jax.device_put(jnp.asarray(list(values), jnp.int32), self.replicated)
