"""The train state pytree and its shardings.

`TrainState(params, opt_state, step, rng)`: master params in `param_dtype` (float32 in every shipped config), the optax state, an int32 step and a
raw uint32 PRNG key (raw keys checkpoint as plain arrays). Sharding: params follow the logical-axis
rules; optimizer moments mirror their params; every other leaf is replicated.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@flax.struct.dataclass
class TrainState:
    """Everything a training step reads and writes; a pytree (jit, shard and checkpoint it whole)."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


def init_train_state(params: Any, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh state at step 0 over `params` (not jitted; see `create_sharded_state` for the sharded build)."""
    return TrainState(
        params=params,
        opt_state=optimizer.init(params),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.PRNGKey(seed),
    )


def opt_state_shardings(opt_state_shape: Any, params_shape: Any, param_shardings: Any, replicated: NamedSharding) -> Any:
    """Shardings for an optax state: every sub-tree shaped like the params takes the params' shardings."""
    params_def = jax.tree.structure(params_shape)
    param_leaf_shapes = [x.shape for x in jax.tree.leaves(params_shape)]

    def is_params_like(node: Any) -> bool:
        if jax.tree.structure(node) != params_def:
            return False
        return [getattr(x, "shape", None) for x in jax.tree.leaves(node)] == param_leaf_shapes

    def assign(node: Any) -> Any:
        if is_params_like(node):
            return param_shardings
        return replicated

    # `is_leaf` stops at params-shaped sub-trees (mu, nu) and at array leaves (count, ...).
    return jax.tree.map(assign, opt_state_shape, is_leaf=lambda n: is_params_like(n) or hasattr(n, "shape"))


def state_shardings(
    mesh: Mesh,
    params_shape: Any,
    param_shardings: Any,
    optimizer: optax.GradientTransformation,
) -> TrainState:
    """The NamedSharding of every leaf of a TrainState built over params shaped like `params_shape`."""
    replicated = NamedSharding(mesh, P())
    opt_shape = jax.eval_shape(optimizer.init, params_shape)
    return TrainState(
        params=param_shardings,
        opt_state=opt_state_shardings(opt_shape, params_shape, param_shardings, replicated),
        step=replicated,
        rng=replicated,
    )


def abstract_state(params_shape: Any, optimizer: optax.GradientTransformation, shardings: TrainState | None = None) -> TrainState:
    """A TrainState of `jax.ShapeDtypeStruct`s (with shardings when given): the restore target."""
    shape = jax.eval_shape(lambda p: init_train_state(p, optimizer, 0), params_shape)
    if shardings is None:
        return shape
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shape, shardings)


def create_sharded_state(
    init_params: Callable[[jax.Array], Any],
    optimizer: optax.GradientTransformation,
    seed: int,
    shardings: TrainState,
) -> TrainState:
    """Initialise params and optimizer directly into their shardings (no full copy on one device)."""

    def build(rng: jax.Array) -> TrainState:
        params_rng, state_rng = jax.random.split(rng)
        params = init_params(params_rng)
        return TrainState(params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32), rng=state_rng)

    return jax.jit(build, out_shardings=shardings)(jax.random.PRNGKey(seed))


def place_state(state: TrainState, shardings: TrainState) -> TrainState:
    """Put an existing (host or differently sharded) state onto `shardings`."""
    return jax.device_put(state, shardings)


def param_count(params: Any) -> int:
    """Number of scalars in a params tree."""
    return int(sum(int(x.size) for x in jax.tree.leaves(params)))


def state_from_params(params: Any, optimizer: optax.GradientTransformation, seed: int, shardings: TrainState) -> TrainState:
    """A step-0 state over given params (e.g. loaded from a Hugging Face directory), placed on `shardings`."""
    params = jax.device_put(params, shardings.params)
    build = jax.jit(
        lambda p: TrainState(params=p, opt_state=optimizer.init(p), step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(seed)),
        in_shardings=(shardings.params,),
        out_shardings=shardings,
    )
    return build(params)
