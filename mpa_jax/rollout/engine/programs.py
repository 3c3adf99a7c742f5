"""The engine's device programs: pure jitted functions over a slot state, one step body for every caller.

Each program runs per replica ([R, ...] arrays; under `shard_map` over a ("replica",) mesh: one device
program per weight copy, no communication) or as a plain jit (R = 1; a sharding mesh places the
outputs). They are cached per static shape, so engines of the same architecture share them:

- `decode_params_program(cfg)`: the weights prepared once per weight version.
- `admit_program(cfg)`: each of `nb` rows placed (copied from another row up to a kept length: a shared
  prefix; cut back; emptied: `models.place_slots`, with the next-token logits when asked), then continued
  by one fixed-size chunk of new tokens after what it holds (`models.extend_slots`): a prompt, or the part
  of one the row does not hold yet.
- `chunk_program(...)`: up to `steps` decode steps (a traced count) over each replica's first slot or all
  its slots (chosen inside), attending over the first `span` columns (gathered once per chunk and written back): each
  slot with its own sampling knobs, seed, step counter, stop ids and token budget. `step` is the one
  step body (sample, stop, write the token) that every generation path runs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from mpa_jax import models
from mpa_jax.rollout import sampling

__all__ = ["decode_params_program", "admit_program", "chunk_program", "step", "N_TOP"]


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


# Top log-probs are always returned this wide (the API's cap, `Engine.generate(top_logprobs=)` <= 64) and
# computed only in chunks where a row asks for them: a request's top_logprobs never picks a program.
N_TOP = 64


@functools.lru_cache(maxsize=None)
def admit_program(cfg: models.ModelConfig, cache_dtype: str | None, span: int, rows: int, chunk: int, small_chunk: int,
                  mesh: Any, out: Any):
    """Admission: each of up to `rows` rows is first placed (`models.place_slots`: a prefix copied from
    another row, cut, emptied, or left as it is), then continued by up to `chunk` new tokens
    (`models.extend_slots`: a chunk of its prompt); rows with no new tokens keep the logits placed with
    them. Only the first `span` columns of each row are read and written (every row's tokens, new ones
    included, lie below it).

    The work is shaped by what each replica was given, as data, inside this one program (a `lax.switch`,
    not a program per shape): 1 or `rows` rows (the host packs a replica's rows from index 0) x
    `small_chunk` or `chunk` new tokens per row; a replica with no row skips the call."""
    shapes = sorted({(nb, c) for nb in (1, rows) for c in (small_chunk, chunk)})

    def admit(params, state, logits, ids, ints):
        # One replica: ids [1, rows, chunk]; ints [1, rows, 6] = (src, dst, keep, copy logits, new tokens,
        # start) as slots of this replica (dst out of range: filler).
        per = logits.shape[1]

        def shaped(nb: int, c: int) -> Callable:
            def run(state, logits):
                src, dst, keep, with_logits, n, start = (ints[0, :nb, j] for j in range(6))
                one = jax.tree.map(lambda x: x[0], state)
                one = models.place_slots(cfg, one, src, dst, keep, span)
                lg = logits[0]
                moved = jnp.where((with_logits != 0)[:, None], lg[jnp.clip(src, 0, per - 1)], lg[jnp.clip(dst, 0, per - 1)])
                lg = lg.at[dst].set(moved, mode="drop")
                new, one = models.extend_slots(cfg, params, one, ids[0, :nb, :c], n, dst, start, cache_dtype, span)
                lg = lg.at[jnp.where(n > 0, dst, per)].set(new, mode="drop")
                return jax.tree.map(lambda x: x[None], one), lg[None]

            return run

        dst, n = ints[0, :, 1], ints[0, :, 4]
        real = dst < per
        nb_big = jnp.sum(real) > 1
        c_big = jnp.max(jnp.where(real, n, 0)) > small_chunk
        # A replica with no row of its own this call skips the work (its filler rows would take a core
        # from the replica that has one: a lone returning episode is the common admission).
        table = jnp.array([[1 + shapes.index((rows if nbb else 1, chunk if cb else small_chunk)) for cb in (0, 1)]
                           for nbb in (0, 1)], jnp.int32)
        pick = jnp.where(jnp.any(real), table[nb_big.astype(jnp.int32), c_big.astype(jnp.int32)], 0)
        branches = [lambda s, lg: (s, lg)] + [shaped(nb, c) for nb, c in shapes]
        return jax.lax.switch(pick, branches, state, logits)

    return _per_replica(admit, mesh, 5, out, (1, 2))


def step(cfg: models.ModelConfig, vocab_limit: int, params: Any, keys: jax.Array, knobs: tuple[jax.Array, ...],
         want_top: jax.Array, carry: tuple) -> tuple:
    """One decode step of every row: sample from its logits (its own knobs, key and step counter), stop
    on a stop id or its budget, feed the token at the row's own column. `carry` = (state, logits, pos,
    t, live, stopped); a row that is not live keeps its state. The sampling path is data: greedy (every
    live row at temperature 0), sampled, or sampled with top-k / top-p filters, each row at temperature
    0 taking its argmax; the `N_TOP` top log-probs are computed when `want_top`. One program for all."""
    temperature, top_k, top_p, max_new, stops = knobs
    state, logits, pos, t, live, stopped = carry
    z = sampling.mask_vocab(logits, vocab_limit)
    sampled = live & (temperature > 0.0)
    filtered = sampled & ((top_k > 0) | (top_p < 1.0))
    path = jnp.where(jnp.any(filtered), 2, jnp.where(jnp.any(sampled), 1, 0))

    def pick(greedy: bool, filt: bool) -> Callable:
        return lambda z: sampling.sample_step(z, keys, t, temperature, top_k, top_p, greedy=greedy, filtered=filt,
                                              mixed=not greedy)

    tok, lp = jax.lax.switch(path, [pick(True, False), pick(False, False), pick(False, True)], z)
    tok = jnp.where(live, tok, 0)
    lp = jnp.where(live, lp, 0.0)

    def tops(z):
        lz = sampling.scaled_logits(z, temperature)
        top_z, top_ids = jax.lax.top_k(lz, N_TOP)
        return top_ids.astype(jnp.int32), top_z - jax.nn.logsumexp(lz, axis=-1, keepdims=True)

    none = lambda z: (jnp.zeros((z.shape[0], N_TOP), jnp.int32), jnp.zeros((z.shape[0], N_TOP), jnp.float32))  # noqa: E731
    top_ids, top_lp = jax.lax.cond(want_top, tops, none, z)
    hit = live & jnp.any(tok[:, None] == stops, axis=1)
    t = t + live.astype(jnp.int32)
    emitted = live
    stopped = stopped | hit
    live = live & ~hit & (t < max_new)
    logits, state = models.decode_slots(cfg, params, tok, pos, live, state, pos)
    pos = pos + live.astype(jnp.int32)
    return (state, logits, pos, t, live, stopped), (tok, lp, emitted, top_ids, top_lp)


def _window(cfg: models.ModelConfig, width: int, span: int):
    """(take, put) between a replica's slot state [R, per, ..., cols] and a chunk's working state
    [R * width, ..., span]: the first `width` slots and `span` columns (rows hold their tokens from
    column 0). `put` writes the window back in place."""
    axes = {"layers": models.slot_cache_axes(cfg), "kv_mask": 1}

    def each(fn: Callable, tree: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
        return {"layers": {n: {leaf: fn(tree["layers"][n][leaf], *(m["layers"][n][leaf] for m in more), a)
                               for leaf, a in leaves.items()} for n, leaves in axes["layers"].items()},
                "kv_mask": fn(tree["kv_mask"], *(m["kv_mask"] for m in more), 1)}

    def take(full: dict[str, Any]) -> dict[str, Any]:
        def one(x: jax.Array, axis: int | None) -> jax.Array:
            r = x.shape[0]
            x = x[:, :width]
            if axis is not None and span < x.shape[axis + 1]:
                x = jax.lax.slice_in_dim(x, 0, span, axis=axis + 1)
            return x.reshape((r * width,) + x.shape[2:])

        return each(one, full)

    def put(full: dict[str, Any], work: dict[str, Any]) -> dict[str, Any]:
        def one(big: jax.Array, new: jax.Array, axis: int | None) -> jax.Array:
            new = new.reshape((big.shape[0], width) + new.shape[1:]).astype(big.dtype)
            if new.shape == big.shape:
                return new
            return jax.lax.dynamic_update_slice(big, new, (0,) * big.ndim)

        return each(one, full, work)

    return take, put


@functools.lru_cache(maxsize=None)
def chunk_program(cfg: models.ModelConfig, vocab_limit: int, steps: int, per: int, span: int, mesh: Any, out: Any):
    """Up to `steps` decode steps (the count run is an input: a short chunk reuses the long one's program)
    over each replica's first slot alone (when no other row of it is live: a lone request) or all its
    `per` slots, chosen as data inside the one program; sampling paths are data too (`step`)."""

    def windowed(width: int) -> Callable:
        take, put = _window(cfg, width, span)

        def run(full_state, full_logits, ints, floats, params):
            r = full_logits.shape[0]
            flat = lambda x: x[:, :width].reshape((r * width,) + x.shape[2:])  # noqa: E731
            state = take(full_state)
            logits, ints, floats = flat(full_logits), flat(ints), flat(floats)
            pos, t, live, top_k, max_new, n_run = ints[:, 0], ints[:, 1], ints[:, 2] != 0, ints[:, 4], ints[:, 5], ints[0, 6]
            want_top = jnp.any(live & (ints[:, 7] != 0))
            seeds, stops = jax.lax.bitcast_convert_type(ints[:, 3], jnp.uint32), ints[:, 8:]
            knobs = (floats[:, 0], top_k, floats[:, 1], max_new, stops)
            s = r * width
            keys = jax.vmap(jax.random.key)(seeds)
            outs = [jnp.zeros((s, steps), jnp.int32), jnp.zeros((s, steps), jnp.float32), jnp.zeros((s, steps), bool),
                    jnp.zeros((s, steps, N_TOP), jnp.int32), jnp.zeros((s, steps, N_TOP), jnp.float32)]

            def body(c):
                k, carry, outs = c
                carry, new = step(cfg, vocab_limit, params, keys, knobs, want_top, carry)
                outs = [o.at[:, k].set(x) for o, x in zip(outs, new)]
                return k + 1, carry, outs

            # A trip count XLA cannot see: with a static one XLA:CPU unrolls the loop and copies every cache
            # of the carry each step. A replica with no live row runs no step (its idle program would take
            # cores from the busy one).
            n_steps = jnp.where(live.any(), jnp.minimum(n_run, steps), 0)
            carry = (state, logits, pos, t, live, jnp.zeros((s,), bool))
            _, carry, outs = jax.lax.while_loop(lambda c: c[0] < n_steps, body, (jnp.int32(0), carry, outs))

            def unflat(x: jax.Array) -> jax.Array:  # [R * width, ...] -> [R, per, ...], zero past `width`
                x = x.reshape((r, width) + x.shape[1:])
                if width == per:
                    return x
                return jnp.zeros((r, per) + x.shape[2:], x.dtype).at[:, :width].set(x)

            state = put(full_state, carry[0])
            logits = unflat(carry[1]) if width == per else jax.lax.dynamic_update_slice(
                full_logits, carry[1].reshape((r, width) + carry[1].shape[1:]), (0, 0, 0))
            return (state, logits, *(unflat(x) for x in (outs[0], outs[1], outs[2], carry[4], carry[5], *outs[3:])))

        return run

    def run(params, full_state, full_logits, ints, floats):
        # Per replica (R = 1 under the replica mesh): its first slot alone when no other of its rows is live.
        if per == 1:
            return windowed(1)(full_state, full_logits, ints, floats, params)
        lone = ~jnp.any(ints[:, 1:, 2] != 0)
        return jax.lax.cond(lone, windowed(1), windowed(per), full_state, full_logits, ints, floats, params)

    return _per_replica(run, mesh, 5, out, (1, 2))
