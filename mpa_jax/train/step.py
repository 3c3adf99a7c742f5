"""The jitted train step: `step(state, batch) -> (state, metrics)`.

The loss function returns a *token sum* and a *token count*; the step sums both over micro-batches
(`lax.scan`) and divides the summed gradient once by the total count. The gradient is therefore the
gradient of (all masked token losses) / (all masked tokens) whatever the micro-batching or packing,
exactly as for one big batch.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mpa_jax.train.state import TrainState

# loss_fn(params, batch) -> (sum of token losses, number of loss tokens); both f32 scalars.
LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]


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
) -> tuple[Any, jax.Array, jax.Array]:
    """(gradient of the mean token loss, token-loss sum, token count) over `batch`, accumulating micro-batches."""
    grad_fn = jax.value_and_grad(lambda p, b: loss_fn(p, b), has_aux=True)
    if micro_batches == 1:
        (loss_sum, count), grads = grad_fn(params, batch)
    else:
        micro = split_micro_batches(batch, micro_batches)

        def body(carry, mb):
            g_acc, s_acc, c_acc = carry
            if micro_batch_sharding is not None:
                mb = {k: jax.lax.with_sharding_constraint(v, micro_batch_sharding[k]) for k, v in mb.items()}
            (s, c), g = grad_fn(params, mb)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            return (g_acc, s_acc + s, c_acc + c), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
        (grads, loss_sum, count), _ = jax.lax.scan(body, init, micro)
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
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
    grads, loss_sum, count = grads_and_stats(loss_fn, state.params, batch, micro_batches, micro_batch_sharding)
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

    metric_sh = {k: replicated for k in ("loss", "loss_sum", "tokens", "grad_norm", "lr")}
    return jax.jit(
        step,
        in_shardings=(state_shardings, dict(batch_sharding)),
        out_shardings=(state_shardings, metric_sh),
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
        loss_fn,
        in_shardings=(param_shardings, dict(batch_sharding)),
        out_shardings=(replicated, replicated),
    )
