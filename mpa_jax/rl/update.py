"""The RL update under a token budget: its memory is bounded by construction.

One optimizer update over a minibatch of rollouts is laid out as:

  * rows of `row_len` tokens, `row_len` = the smallest power of two (>= `MIN_ROW_LEN`) that holds the
    minibatch's longest episode, capped at `rl.seq_len` (compact episodes of ~400-900 tokens get rows of
    1,024, not 4,096: attention memory grows with the square of the row length);
  * micro-batches of `rows_per_device` rows per data-parallel device, `rows_per_device * row_len <=
    rl.tokens_per_micro_batch` (at least one row);
  * as many micro-batches as the packed rows need, each one jitted call that *adds* its gradient, token-loss
    sum, token count and metric sums into an accumulator; one final call divides the summed gradient by
    the total token count and applies the optimizer.

So whatever the number of rollouts, no compiled computation ever sees more than
`tokens_per_micro_batch` tokens per device, and the gradient is exactly that of (all masked token
losses) / (all masked tokens), as one big batch would give (`train.step`'s contract; the tests compare
the two). Compiled shapes: one per (row length, rows per device), i.e. a handful per run.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mpa_jax.train import step as steplib
from mpa_jax.train.state import TrainState

MIN_ROW_LEN = 128


def row_length(longest: int, seq_len: int) -> int:
    """Row length for a minibatch whose longest sequence has `longest` tokens: the smallest power of two
    >= max(longest, MIN_ROW_LEN), capped at `seq_len`. Raises ValueError when `longest` > `seq_len`."""
    if longest > seq_len:
        raise ValueError(f"an episode of {longest} tokens does not fit a row of config.rl.seq_len={seq_len} tokens"
                         f" (raise rl.seq_len, or lower rollout.max_total_tokens so episodes stay shorter)")
    n = 1 << (max(int(longest), MIN_ROW_LEN) - 1).bit_length()
    return min(n, int(seq_len))


def rows_per_device(row_len: int, tokens_per_micro_batch: int, needed_rows: int) -> int:
    """Rows of one micro-batch on one data-parallel device: as many as the budget allows, but no more
    than the minibatch needs (rounded up to a power of two, fewer shapes)."""
    if row_len > tokens_per_micro_batch:
        raise ValueError(f"a row of {row_len} tokens exceeds config.rl.tokens_per_micro_batch={tokens_per_micro_batch}")
    cap = tokens_per_micro_batch // row_len
    need = 1 << (max(int(needed_rows), 1) - 1).bit_length()
    return max(1, min(cap, need))


def check_budget(seq_len: int, tokens_per_micro_batch: int) -> None:
    """Setup check: a row of the longest allowed length must fit one device's micro-batch."""
    if tokens_per_micro_batch < seq_len:
        raise ValueError(f"config.rl.tokens_per_micro_batch={tokens_per_micro_batch} must be >= config.rl.seq_len={seq_len}"
                         f" (one row of the longest allowed episode per device and micro-batch)")


def split_rows(packed: Mapping[str, np.ndarray], rows_per_micro: int) -> list[dict[str, np.ndarray]]:
    """Contiguous row blocks of `rows_per_micro` rows (the row count must be a multiple)."""
    n = next(iter(packed.values())).shape[0]
    if n % rows_per_micro:
        raise ValueError(f"{n} packed rows do not split into micro-batches of {rows_per_micro} rows")
    return [{k: v[i:i + rows_per_micro] for k, v in packed.items()} for i in range(0, n, rows_per_micro)]


class BudgetedUpdate:
    """`update(state, micro_batches) -> (state, metrics)`: one optimizer step over a list of micro-batches
    (dicts of [rows, row_len] arrays, placed with the row sharding), metrics as `train.step.train_step`
    reports them (loss, loss_sum, tokens, grad_norm, lr and the loss' extras as token means)."""

    def __init__(self, loss_fn: Callable, optimizer: optax.GradientTransformation, schedule: optax.Schedule | None,
                 state_shardings: TrainState, row_sharding: NamedSharding):
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.schedule = schedule
        mesh = row_sharding.mesh
        replicated = NamedSharding(mesh, P())
        p_sh = state_shardings.params
        grad_fn = steplib.value_and_grad(loss_fn)

        def accumulate(acc, params, mb):
            (s, (c, e)), g = grad_fn(params, mb)
            return steplib.accumulate(acc, g, s, c, e)

        def apply(state: TrainState, acc):
            return steplib.apply_gradients(state, *acc, optimizer=optimizer, schedule=schedule)

        self._p_sh, self._replicated, self._row_sh = p_sh, replicated, row_sharding
        self._acc_sh = None
        self._accumulate_fn = accumulate
        self._accumulate = None
        self._zeros = None
        self._apply = jax.jit(apply, in_shardings=(state_shardings, None), out_shardings=(state_shardings, replicated),
                              donate_argnums=(0,))  # the accumulator has no output to alias

    def _init_acc(self, params: Any, mb: Mapping[str, jax.Array]):
        if self._accumulate is None:  # the extras are scalars: one accumulator layout for every micro-batch shape
            extras_shape = jax.eval_shape(lambda p, b: steplib.split_loss_output(self.loss_fn(p, b))[2], params, mb)
            self._acc_sh = (self._p_sh, self._replicated, self._replicated, {k: self._replicated for k in extras_shape})
            self._accumulate = jax.jit(self._accumulate_fn, in_shardings=(self._acc_sh, self._p_sh, None),
                                       out_shardings=self._acc_sh, donate_argnums=(0,))
            self._zeros = jax.jit(lambda p: (jax.tree.map(jnp.zeros_like, p), jnp.zeros((), jnp.float32),
                                             jnp.zeros((), jnp.float32), steplib.zero_extras(extras_shape)), out_shardings=self._acc_sh)
        return self._zeros(params)

    def __call__(self, state: TrainState, micro_batches: Sequence[Mapping[str, jax.Array]]) -> tuple[TrainState, dict[str, jax.Array]]:
        if not micro_batches:
            raise ValueError("BudgetedUpdate: no micro-batches")
        acc = self._init_acc(state.params, micro_batches[0])
        for mb in micro_batches:
            acc = self._accumulate(acc, state.params, dict(mb))
        return self._apply(state, acc)
