"""The jitted train step: `step(state, batch) -> (state, metrics)`.

The loss function returns a *token sum* and a *token count*; the step sums both over micro-batches
(`lax.scan`) and divides the summed gradient once by the total count. The gradient is therefore the
gradient of (all masked token losses) / (all masked tokens) whatever the micro-batching or packing,
exactly as for one big batch.

A loss function may also return a third element, a dict of extra per-token *sums* (clip fraction,
KL, entropy, ...): they are summed over micro-batches like the loss and reported divided by the token
count (a token-weighted mean). Keys ending in `_max` / `_min` are reduced by max / min instead and
reported as they are. The metric set of a step is therefore the fixed one plus the loss' extras.

The pieces are public so that other update layouts (the RL update's token-budgeted micro-batches,
`rl/update.py`) apply gradients exactly as this step does: `value_and_grad` (the loss' gradient with its
sums), `accumulate` (add one micro-batch into an accumulator), `apply_gradients` (divide by the token
count, clip/optimise, metrics).

A non-finite update is skipped: when the loss, the gradient norm or the update is NaN or inf, `apply_gradients` keeps
the parameters and optimizer state as they were (the step counter does not advance) and reports
`nonfinite` = 1, so the trainer can log it, never checkpoint the poisoned step, and stop after a run of them.
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


def split_loss_output(out: tuple) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(sum, count) or (sum, count, extras) -> (sum, count, extras)."""
    if len(out) == 2:
        return out[0], out[1], {}
    if len(out) == 3:
        return out[0], out[1], dict(out[2])
    raise ValueError(f"a loss function returns (sum, count) or (sum, count, extras); got {len(out)} values")


def combine_extras(a: dict[str, jax.Array], b: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Two extras sums combined (max/min keys by max/min)."""
    out = {}
    for k in a:
        if k.endswith("_max"):
            out[k] = jnp.maximum(a[k], b[k])
        elif k.endswith("_min"):
            out[k] = jnp.minimum(a[k], b[k])
        else:
            out[k] = a[k] + b[k]
    return out


def zero_extras(shapes: Mapping[str, jax.ShapeDtypeStruct]) -> dict[str, jax.Array]:
    """The identity of `combine_extras` for extras of these shapes."""
    return {k: jnp.full(v.shape, -jnp.inf if k.endswith("_max") else (jnp.inf if k.endswith("_min") else 0.0), v.dtype)
            for k, v in shapes.items()}


def value_and_grad(loss_fn: LossFn) -> Callable:
    """`f(params, batch) -> ((token-loss sum, (token count, extras)), gradient of the sum)`."""

    def wrapped(p, b):
        s, c, extras = split_loss_output(loss_fn(p, b))
        return s, (c, extras)

    return jax.value_and_grad(wrapped, has_aux=True)


def accumulate(acc: tuple, grads: Any, loss_sum: jax.Array, count: jax.Array, extras: dict[str, jax.Array]) -> tuple:
    """(summed gradient, loss sum, token count, extras) plus one micro-batch's."""
    g_acc, s_acc, c_acc, e_acc = acc
    return jax.tree.map(jnp.add, g_acc, grads), s_acc + loss_sum, c_acc + count, combine_extras(e_acc, extras)


def apply_gradients(state: TrainState, grads_sum: Any, loss_sum: jax.Array, count: jax.Array, extras: dict[str, jax.Array], *,
                    optimizer: optax.GradientTransformation, schedule: optax.Schedule | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step from summed gradients: divide by the token count, update, report the metrics; a
    non-finite loss or gradient norm leaves the state as it was (`nonfinite` = 1; see the module docstring)."""
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads_sum)
    grad_norm = optax.global_norm(grads)
    loss = loss_sum / denom
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    # the update's own norm too: a corrupted optimizer state turns finite gradients into non-finite steps
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    rng, _ = jax.random.split(state.rng)
    metrics = {
        "loss": loss,
        "loss_sum": loss_sum,
        "tokens": count,
        "grad_norm": grad_norm,
        "lr": schedule(state.step) if schedule is not None else jnp.zeros((), jnp.float32),
        "nonfinite": 1.0 - finite.astype(jnp.float32),
        **extras_as_metrics(extras, count),
    }
    new = TrainState(params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                     step=state.step + finite.astype(state.step.dtype), rng=rng)
    return new, metrics


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
    divide: bool = True,
) -> tuple:
    """(gradient of the mean token loss, token-loss sum, token count[, summed extras]) over `batch`,
    accumulating micro-batches. The extras are returned only with `with_extras`; `divide=False` returns
    the summed gradient and the extras (what `apply_gradients` takes)."""

    grad_fn = value_and_grad(loss_fn)
    if micro_batches == 1:
        (loss_sum, (count, extras)), grads = grad_fn(params, batch)
    else:
        micro = split_micro_batches(batch, micro_batches)

        def body(carry, mb):
            if micro_batch_sharding is not None:
                mb = {k: jax.lax.with_sharding_constraint(v, micro_batch_sharding[k]) for k, v in mb.items()}
            (s, (c, e)), g = grad_fn(params, mb)
            return accumulate(carry, g, s, c, e), None

        first = jax.tree.map(lambda v: v[0], micro)
        extras_shape = jax.eval_shape(lambda p, b: split_loss_output(loss_fn(p, b))[2], params, first)
        zeros = jax.tree.map(jnp.zeros_like, params)
        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zero_extras(extras_shape))
        (grads, loss_sum, count, extras), _ = jax.lax.scan(body, init, micro)
    if not divide:
        return grads, loss_sum, count, extras
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
    grads, loss_sum, count, extras = grads_and_stats(loss_fn, state.params, batch, micro_batches, micro_batch_sharding, divide=False)
    return apply_gradients(state, grads, loss_sum, count, extras, optimizer=optimizer, schedule=schedule)


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
        lambda p, b: split_loss_output(loss_fn(p, b))[:2],
        in_shardings=(param_shardings, dict(batch_sharding)),
        out_shardings=(replicated, replicated),
    )
