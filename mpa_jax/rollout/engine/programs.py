"""The engine's device programs: pure jitted functions over a slot state, one step body for every caller.

Each program runs per replica ([R, ...] arrays; under `shard_map` over a ("replica",) mesh: one device
program per weight copy, no communication) or as a plain jit (R = 1; a sharding mesh places the
outputs). They are cached per static shape, so engines of the same architecture share them:

- `decode_params_program(cfg)`: the weights prepared once per weight version.
- `admit_program(cfg)`: each of `nb` rows placed (copied from another row up to a kept length: a shared
  prefix; cut back; emptied: `models.place_slots`, with the next-token logits when asked), then continued
  by one fixed-size chunk of new tokens after what it holds (`models.extend_slots`): a prompt, or the part
  of one the row does not hold yet.
- `chunk_program(...)`: up to `steps` decode steps (a traced count) over `width` chosen slots of each
  replica (the rows that run; idle rows are not computed), attending over the first `span` columns
  (gathered once per chunk and written back): each slot with its own sampling knobs, seed, step counter,
  stop ids and token budget. `step` is the one step body (sample, stop, write the token) that every
  generation path runs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from mpa_jax import models
from mpa_jax.rollout import sampling

__all__ = ["decode_params_program", "admit_program", "chunk_program", "step"]


@functools.lru_cache(maxsize=None)
def decode_params_program(cfg: models.ModelConfig):
    return jax.jit(functools.partial(models.decode_params, cfg))


def _per_replica(fn: Callable, mesh: Any, n_args: int, out: Any, donate: tuple[int, ...]) -> Callable:
    """`fn` over [R, ...] arrays: under `shard_map` over the replica mesh (each replica runs its own rows
    as a one-device program); the first argument is replicated when `n_args` counts it. Without a mesh,
    `fn` as it is (R = 1), its outputs placed by `out` (a sharding mesh: replicated) when given."""
    if mesh is None:
        return jax.jit(fn, donate_argnums=donate, out_shardings=out)
    from jax.sharding import PartitionSpec as P

    rows = P("replica")
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(P(),) + (rows,) * (n_args - 1), out_specs=rows, check_vma=False)
    return jax.jit(fn, donate_argnums=donate)


@functools.lru_cache(maxsize=None)
def admit_program(cfg: models.ModelConfig, cache_dtype: str | None, span: int, mesh: Any, out: Any):
    """Admission: each of `nb` rows is first placed (`models.place_slots`: a prefix copied from another
    row, cut, emptied, or left as it is), then continued by up to C new tokens (`models.extend_slots`: a
    chunk of its prompt); rows with no new tokens keep the logits placed with them. Only the first `span`
    columns of each row are read and written (every row's tokens, new ones included, lie below it)."""

    def admit(params, state, logits, ids, ints):
        # One replica: ids [1, nb, C]; ints [1, nb, 6] = (src, dst, keep, copy logits, new tokens, start) as
        # slots of this replica (dst out of range: filler).
        src, dst, keep, with_logits, n, start = (ints[0, :, j] for j in range(6))
        per = logits.shape[1]

        def run(state, logits):
            one = jax.tree.map(lambda x: x[0], state)
            one = models.place_slots(cfg, one, src, dst, keep, span)
            lg = logits[0]
            moved = jnp.where((with_logits != 0)[:, None], lg[jnp.clip(src, 0, per - 1)], lg[jnp.clip(dst, 0, per - 1)])
            lg = lg.at[dst].set(moved, mode="drop")
            new, one = models.extend_slots(cfg, params, one, ids[0], n, dst, start, cache_dtype, span)
            lg = lg.at[jnp.where(n > 0, dst, per)].set(new, mode="drop")
            return jax.tree.map(lambda x: x[None], one), lg[None]

        # A replica with no row of its own this call skips the work (its filler rows would take a core
        # from the replica that has one: a lone returning episode is the common admission).
        return jax.lax.cond(jnp.any(dst < per), run, lambda s, lg: (s, lg), state, logits)

    return _per_replica(admit, mesh, 5, out, (1, 2))


def step(cfg: models.ModelConfig, vocab_limit: int, greedy: bool, filtered: bool, n_top: int, params: Any, keys: jax.Array,
         knobs: tuple[jax.Array, ...], carry: tuple) -> tuple:
    """One decode step of every row: sample from its logits (its own knobs, key and step counter), stop
    on a stop id or its budget, feed the token at the row's own column. `carry` = (state, logits, pos,
    t, live, stopped, token, log-prob, top ids, top log-probs); a row that is not live keeps its state."""
    temperature, top_k, top_p, max_new, stops = knobs
    state, logits, pos, t, live, stopped = carry
    picked = sampling.sample_step(sampling.mask_vocab(logits, vocab_limit), keys, t, temperature, top_k, top_p,
                                  greedy=greedy, filtered=filtered, mixed=not greedy, n_top=n_top)
    tok = jnp.where(live, picked[0], 0)
    lp = jnp.where(live, picked[1], 0.0)
    hit = live & jnp.any(tok[:, None] == stops, axis=1)
    t = t + live.astype(jnp.int32)
    emitted = live
    stopped = stopped | hit
    live = live & ~hit & (t < max_new)
    logits, state = models.decode_slots(cfg, params, tok, pos, live, state, pos)
    pos = pos + live.astype(jnp.int32)
    return (state, logits, pos, t, live, stopped), (tok, lp, emitted, *picked[2:])


def _window(cfg: models.ModelConfig, width: int, span: int):
    """(take, put) between a replica's slot state [R, per, ..., cols] and a chunk's working state
    [R * width, ..., span]: the slots `sel` [R, width] of each replica (all of them in order when `width`
    is every slot) and their first `span` columns (rows hold their tokens from column 0). `put` writes
    the window back in place."""
    axes = {"layers": models.slot_cache_axes(cfg), "kv_mask": 1}

    def each(fn: Callable, tree: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
        return {"layers": {n: {leaf: fn(tree["layers"][n][leaf], *(m["layers"][n][leaf] for m in more), a)
                               for leaf, a in leaves.items()} for n, leaves in axes["layers"].items()},
                "kv_mask": fn(tree["kv_mask"], *(m["kv_mask"] for m in more), 1)}

    def take(full: dict[str, Any], sel: jax.Array) -> dict[str, Any]:
        def one(x: jax.Array, axis: int | None) -> jax.Array:
            r, per = x.shape[:2]
            if axis is not None and span < x.shape[axis + 1]:
                x = jax.lax.slice_in_dim(x, 0, span, axis=axis + 1)
            if width < per:  # a gather of the chunk's rows: idle rows cost nothing
                x = jax.vmap(lambda rows, i: jnp.take(rows, i, axis=0))(x, sel)
            return x.reshape((r * width,) + x.shape[2:])

        return each(one, full)

    def put(full: dict[str, Any], work: dict[str, Any], sel: jax.Array) -> dict[str, Any]:
        def one(big: jax.Array, new: jax.Array, axis: int | None) -> jax.Array:
            new = new.reshape((big.shape[0], width) + new.shape[1:]).astype(big.dtype)
            if new.shape == big.shape:
                return new
            if width == big.shape[1]:
                return jax.lax.dynamic_update_slice(big, new, (0,) * big.ndim)
            cut = (slice(None),) * (axis - 1) + (slice(0, new.shape[axis + 1]),) if axis is not None else ()
            return jax.vmap(lambda rows, i, n: rows.at[(i,) + cut].set(n))(big, sel, new)

        return each(one, full, work)

    return take, put


@functools.lru_cache(maxsize=None)
def chunk_program(cfg: models.ModelConfig, vocab_limit: int, steps: int, greedy: bool, filtered: bool, n_top: int,
                  width: int, span: int, mesh: Any, out: Any):
    """Up to `steps` decode steps (the count run is an input: a short chunk reuses the long one's program)
    over the `width` slots `sel` [R, width] of each replica (ints and floats come in that order)."""
    take, put = _window(cfg, width, span)

    def run(params, full_state, full_logits, sel, ints, floats):
        # [R, width, ...] -> [R * width, ...]: the slots of this chunk as one batch (R = 1 per replica).
        r, per = full_logits.shape[:2]
        flat = lambda x: x.reshape((r * width,) + x.shape[2:])  # noqa: E731
        state = take(full_state, sel)
        logits = flat(full_logits if width == per else jax.vmap(lambda rows, i: rows[i])(full_logits, sel))
        ints, floats = flat(ints), flat(floats)
        pos, t, live, top_k, max_new, n_run = ints[:, 0], ints[:, 1], ints[:, 2] != 0, ints[:, 4], ints[:, 5], ints[0, 6]
        seeds, stops = jax.lax.bitcast_convert_type(ints[:, 3], jnp.uint32), ints[:, 7:]
        knobs = (floats[:, 0], top_k, floats[:, 1], max_new, stops)
        s = r * width
        keys = jax.vmap(jax.random.key)(seeds)
        outs = [jnp.zeros((s, steps), jnp.int32), jnp.zeros((s, steps), jnp.float32), jnp.zeros((s, steps), bool)]
        if n_top:
            outs += [jnp.zeros((s, steps, n_top), jnp.int32), jnp.zeros((s, steps, n_top), jnp.float32)]

        def body(c):
            k, carry, outs = c
            carry, new = step(cfg, vocab_limit, greedy, filtered, n_top, params, keys, knobs, carry)
            outs = [o.at[:, k].set(x) for o, x in zip(outs, new)]
            return k + 1, carry, outs

        # A trip count XLA cannot see: with a static one XLA:CPU unrolls the loop and copies every cache
        # of the carry each step. A replica with no live row runs no step (its idle program would take
        # cores from the busy one).
        n_steps = jnp.where(live.any(), jnp.minimum(n_run, steps), 0)
        carry = (state, logits, pos, t, live, jnp.zeros((s,), bool))
        _, carry, outs = jax.lax.while_loop(lambda c: c[0] < n_steps, body, (jnp.int32(0), carry, outs))
        unflat = lambda x: x.reshape((r, width) + x.shape[1:])  # noqa: E731
        state = put(full_state, carry[0], sel)
        logits = unflat(carry[1])
        if width < per:
            logits = jax.vmap(lambda rows, i, n: rows.at[i].set(n))(full_logits, sel, logits)
        return (state, logits, *(unflat(x) for x in (outs[0], outs[1], outs[2], carry[4], carry[5], *outs[3:])))

    return _per_replica(run, mesh, 6, out, (1, 2))
