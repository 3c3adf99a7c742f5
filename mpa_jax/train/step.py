"""The jitted train step: `step(state, batch) -> (state, metrics)`.

The loss function returns a *token sum* and a *token count*; the step sums both over micro-batches
(`lax.scan`) and divides the summed gradient once by the total count. The gradient is therefore the
gradient of (all masked token losses) / (all masked tokens) whatever the micro-batching or packing,
exactly as for one big batch.

A loss function may also return a third element, a dict of extra per-token *sums* (clip fraction,
KL, entropy, ...): they are summed over micro-batches like the loss and reported divided by the token
count (a token-weighted mean). Keys ending in `_max` / `_min` are reduced by max / min instead and
reported as they are. The metric set of a step is therefore the fixed one plus the loss' extras.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mpa_jax.train.state import TrainState

# loss_fn(params, batch) -> (sum of token losses, number of loss tokens[, {name: per-token sum}]);
# f32 scalars.
LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple]


def _split_loss_output(out: tuple) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(sum, count) or (sum, count, extras) -> (sum, count, extras)."""
    if len(out) == 2:
        return out[0], out[1], {}
    if len(out) == 3:
        return out[0], out[1], dict(out[2])
    raise ValueError(f"a loss function returns (sum, count) or (sum, count, extras); got {len(out)} values")


def _combine_extras(a: dict[str, jax.Array], b: dict[str, jax.Array]) -> dict[str, jax.Array]:
    out = {}
    for k in a:
        if k.endswith("_max"):
            out[k] = jnp.maximum(a[k], b[k])
        elif k.endswith("_min"):
            out[k] = jnp.minimum(a[k], b[k])
        else:
            out[k] = a[k] + b[k]
    return out


def extras_as_metrics(extras: Mapping[str, jax.Array], count: jax.Array) -> dict[str, jax.Array]:
    """Token-weighted means of the summed extras (max/min keys as they are)."""
    denom = jnp.maximum(count, 1.0)
    return {k: (v if k.endswith(("_max", "_min")) else v / denom) for k, v in extras.items()}


def split_micro_batches(batch: Mapping[str, jax.Array], micro_batches: int) -> dict[str, jax.Array]:
    """[B, ...] -> [M, B/M, ...] with micro-batch m = rows r where r % M == m.

    Interleaving (rather than contiguous blocks) keeps every micro-batch spread over all data-parallel
    devices when the batch rows are sharded in contiguous blocks.
    """
    out = {}
    for k, v in batch.items():
        b = v.shape[0]
        if b % micro_batches:
            raise ValueError(f"batch of {b} rows does not split into {micro_batches} micro-batches")
        v = v.reshape((b // micro_batches, micro_batches) + v.shape[1:])
        out[k] = jnp.swapaxes(v, 0, 1)
    return out


def grads_and_stats(
    loss_fn: LossFn,
    params: Any,
    batch: Mapping[str, jax.Array],
    micro_batches: int = 1,
    micro_batch_sharding: Mapping[str, NamedSharding] | None = None,
    *,
    with_extras: bool = False,
) -> tuple:
    """(gradient of the mean token loss, token-loss sum, token count[, summed extras]) over `batch`,
    accumulating micro-batches. The extras are returned only with `with_extras`."""

    def wrapped(p, b):
        s, c, extras = _split_loss_output(loss_fn(p, b))
        return s, (c, extras)

    grad_fn = jax.value_and_grad(wrapped, has_aux=True)
    if micro_batches == 1:
        (loss_sum, (count, extras)), grads = grad_fn(params, batch)
    else:
        micro = split_micro_batches(batch, micro_batches)

        def body(carry, mb):
            g_acc, s_acc, c_acc, e_acc = carry
            if micro_batch_sharding is not None:
                mb = {k: jax.lax.with_sharding_constraint(v, micro_batch_sharding[k]) for k, v in mb.items()}
            (s, (c, e)), g = grad_fn(params, mb)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            return (g_acc, s_acc + s, c_acc + c, _combine_extras(e_acc, e)), None

        first = jax.tree.map(lambda v: v[0], micro)
        extras_shape = jax.eval_shape(lambda p, b: wrapped(p, b)[1][1], params, first)
        e_init = {
            k: jnp.full(v.shape, -jnp.inf if k.endswith("_max") else (jnp.inf if k.endswith("_min") else 0.0), v.dtype)
            for k, v in extras_shape.items()
        }
        zeros = jax.tree.map(jnp.zeros_like, params)
        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), e_init)
        (grads, loss_sum, count, extras), _ = jax.lax.scan(body, init, micro)
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    if with_extras:
        return grads, loss_sum, count, extras
    return grads, loss_sum, count


def train_step(
    state: TrainState,
    batch: Mapping[str, jax.Array],
    *,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule | None = None,
    micro_batches: int = 1,
    micro_batch_sharding: Mapping[str, NamedSharding] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step; a pure function (jit it with `make_train_step`)."""
    grads, loss_sum, count, extras = grads_and_stats(
        loss_fn, state.params, batch, micro_batches, micro_batch_sharding, with_extras=True
    )
    grad_norm = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics = {
        "loss": loss_sum / jnp.maximum(count, 1.0),
        "loss_sum": loss_sum,
        "tokens": count,
        "grad_norm": grad_norm,
        "lr": schedule(state.step) if schedule is not None else jnp.zeros((), jnp.float32),
        **extras_as_metrics(extras, count),
    }
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=rng), metrics


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    state_shardings: TrainState,
    batch_sharding: Mapping[str, NamedSharding],
    *,
    schedule: optax.Schedule | None = None,
    micro_batches: int = 1,
    donate: bool = True,
) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """`train_step` jitted with explicit in/out shardings; the state argument is donated."""
    mesh = next(iter(batch_sharding.values())).mesh
    replicated = NamedSharding(mesh, P())
    micro_sh = dict(batch_sharding) if micro_batches > 1 else None

    def step(state: TrainState, batch: Mapping[str, jax.Array]):
        return train_step(
            state, batch, loss_fn=loss_fn, optimizer=optimizer, schedule=schedule,
            micro_batches=micro_batches, micro_batch_sharding=micro_sh,
        )

    # One sharding for the whole metrics dict (a pytree prefix): whatever keys the loss adds.
    return jax.jit(
        step,
        in_shardings=(state_shardings, dict(batch_sharding)),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,) if donate else (),
    )


def make_eval_step(
    loss_fn: LossFn,
    param_shardings: Any,
    batch_sharding: Mapping[str, NamedSharding],
) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]:
    """Jitted (loss sum, token count) of a batch under given params: the held-out loss hook."""
    mesh = next(iter(batch_sharding.values())).mesh
    replicated = NamedSharding(mesh, P())
    return jax.jit(
        lambda p, b: _split_loss_output(loss_fn(p, b))[:2],
        in_shardings=(param_shardings, dict(batch_sharding)),
        out_shardings=(replicated, replicated),
    )
