"""Slot-based decoding for a server: requests join and leave the running batch between decode chunks.

`JaxEngine.generate` decodes a whole batch as one compiled program, so a request that arrives while it
runs waits for all of it. `SlotDecoder` instead keeps a fixed number of *slots* (the server's rows),
each a row of a batched KV cache of `max_len` columns, and three kinds of jitted programs:

- `prefill`: writes up to `nb` new prompts per replica (left-padded to a power-of-two bucket) into free
  slots (their cache rows and next-token logits); other slots are untouched.
- `decode chunk`: `chunk` decode steps over the slots in use (a prefix of each replica's slots), each
  slot with its own temperature, top-k/top-p, seed, step counter, stop ids and token budget (the
  vocabulary rule applies: ids >= `vocab_limit` are never sampled). A slot stops on a stop id
  (`<|im_end|>`) or its budget; finished and free slots ride along masked.
- `decode_params`: the weights prepared once per weight version (as JaxEngine does inside its program).

`SlotLoop` is the host side: a thread that, between chunks, admits waiting requests into free slots,
hands each request its new tokens (`on_update`; a request that only wants its result gets one call),
retires finished or cancelled requests, and runs the chunk. A request arriving mid-generation waits at
most one chunk plus one prefill. A lone settled request (nobody else running or waiting) runs in
chunks of `long_chunk` steps (default 4 x chunk): fewer host round trips per token.

The caches are rings: every step writes column `head` of every row (the batched engine step's
in-place one-column update) and advances the head, so slots at different lengths share one write
column; a prompt is placed in the columns just behind the head when it is admitted, and a row attends
to its valid columns in whatever order (keys carry their RoPE positions). Token t of a request is drawn
from `fold_in(key(seed), t)` as in JaxEngine, so a request's tokens do not depend on what else runs
(up to float rounding between batch shapes). With engine replicas (CPU: one device per core) the slots
are split over those devices and every program runs per replica under `shard_map` (no SPMD
partitioning, no communication). Requests that do not fit a slot (prompt bucket + max_new_tokens >
max_len) run through `engine.generate_rows` between chunks.

Supported: the `qwen3` family without a mesh; `slot_support(engine)` says why not otherwise (the server
then keeps the per-call batcher).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout import sampling
from mpa_jax.rollout.types import GenerateResult, SamplingParams

log = logging.getLogger(__name__)

SUPPORTED_FAMILIES = ("qwen3",)


def _bucket(n: int, minimum: int = 1) -> int:
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _coarse(n: int, cap: int) -> int:
    """Smallest power of four >= n, capped: few distinct batch widths, so few compiled programs."""
    b = 1
    while b < n:
        b *= 4
    return min(b, cap)


def _prompt_bucket(n: int, minimum: int) -> int:
    """Prefill width: a power of two up to 256, then a multiple of 256 (long prompts waste little of a slot)."""
    b = _bucket(n, minimum)
    return b if b <= 256 else -(-int(n) // 256) * 256


def slot_support(engine: Any) -> str | None:
    """None when `engine` can run under `SlotDecoder`, else the reason it cannot."""
    cfg = getattr(engine, "cfg", None)
    if cfg is None or not hasattr(engine, "generate_rows") or not hasattr(engine, "params"):
        return f"{type(engine).__name__} is not the embedded JaxEngine"
    if cfg.family not in SUPPORTED_FAMILIES:
        return f"model family {cfg.family!r} is not supported by the slot loop (supported: {', '.join(SUPPORTED_FAMILIES)})"
    if getattr(engine, "mesh", None) is not None:
        return "the engine is sharded over a mesh; the slot loop runs replicated weights only"
    return None


@dataclasses.dataclass
class Update:
    """What one request got since its last update: new tokens (and their log-probs / top log-probs);
    `result` is set on the last update, `error` when the request failed."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    result: GenerateResult | None = None
    error: BaseException | None = None


@dataclasses.dataclass(eq=False)
class SlotRequest:
    """One row to generate. `on_update` is called from the loop's thread (after every chunk with the new
    tokens when `updates`, else once with the result: what a non-streamed answer needs, and no per-chunk
    hand-off to the consumer's event loop); set `cancelled` to end it early (its result then carries the
    tokens so far with finish_reason "length")."""

    prompt: list[int]
    params: SamplingParams
    seed: int
    top_logprobs: int
    on_update: Callable[[Update], None]
    updates: bool = True
    cancelled: bool = False
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    tops: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)


class SlotDecoder:
    """Device state and programs for `slots` rows of up to `max_len` tokens each (see the module docstring)."""

    def __init__(self, engine: Any, slots: int, max_len: int, chunk: int = 4, min_prompt_bucket: int = 16,
                 max_prefill: int = 16, long_chunk: int | None = None) -> None:
        reason = slot_support(engine)
        if reason is not None:
            raise ValueError(f"SlotDecoder: {reason}")
        if chunk < 1 or max_len < 2:
            raise ValueError(f"SlotDecoder: chunk must be >= 1 and max_len >= 2, got {chunk}, {max_len}")
        self.engine = engine
        self.cfg = engine.cfg
        self.replicas = int(getattr(engine, "replicas", 1))
        # Slots live as [replicas, per_replica]; slot s is (s % R, s // R), so the lowest slots (the ones
        # the loop fills first) are spread over the replicas, and a chunk runs only over a prefix of
        # each replica's slots wide enough for the busiest one (`width`): a lone request costs a
        # 1-row step, not a step over every slot.
        self.per_replica = _bucket(-(-max(int(slots), 1) // self.replicas))
        self.slots = self.per_replica * self.replicas
        self.max_len = min(int(max_len), int(self.cfg.max_position_embeddings))
        self.chunk = int(chunk)
        # Steps per chunk for a lone settled request (`SlotLoop._steps_next`): fewer host round trips
        # per token (each one a sync of every replica); a request arriving mid-chunk waits longer.
        self.long_chunk = max(int(long_chunk) if long_chunk is not None else 4 * self.chunk, self.chunk)
        self.min_prompt_bucket = int(min_prompt_bucket)
        self.max_prefill = _bucket(max_prefill)
        self.vocab_limit = int(engine.vocab_limit)
        mesh = getattr(engine, "_replica_mesh", None)
        from jax.sharding import NamedSharding, PartitionSpec

        self._mesh = mesh  # programs run per replica under shard_map over it (None: one device)
        if mesh is not None:
            self._rows = NamedSharding(mesh, PartitionSpec("replica"))
            self._repl = NamedSharding(mesh, PartitionSpec())
        else:
            dev = jax.local_devices()[0]
            self._rows = self._repl = jax.sharding.SingleDeviceSharding(dev)
        self._params_version: str | None = None
        self._src: Any = None
        self._dparams = None
        # One batched cache per replica ([R, per, ...]: every slot's row), written as a ring: every step
        # writes column `head` of every row (the engine's in-place one-column update, not a per-row
        # scatter), then head += 1 mod max_len. A prompt is placed in the columns just behind the head
        # when it is admitted, so a slot's tokens are contiguous (mod max_len) and the head cannot reach
        # its prompt again before prompt bucket + max_new columns were written (`fits`).
        state = jax.eval_shape(lambda: models.init_decode_state(self.cfg, self.per_replica, self.max_len, engine.cache_dtype))
        state = {"layers": state["layers"], "kv_mask": state["kv_mask"]}
        self.state = jax.tree.map(lambda s: jnp.zeros((self.replicas,) + s.shape, s.dtype), state)
        self.state = jax.device_put(self.state, self._rows)
        self.logits = jax.device_put(jnp.zeros((self.replicas, self.per_replica, self.cfg.vocab_size), jnp.float32), self._rows)
        self.head = 0  # the ring's next write column (host copy; every chunk advances it by `chunk`)
        self.prefills = 0  # prefill program calls
        self.steps = 0  # decode chunk calls

    # ---- programs ------------------------------------------------------------------------------------

    def params(self) -> Any:
        """The engine's weights prepared for decoding, refreshed when its weight version changes."""
        version = self.engine.weight_version
        if self._dparams is None or version != self._params_version or self._src is not self.engine.params:
            self._src = self.engine.params
            self._dparams = _jitted_decode_params(self.cfg)(self.engine.params)
            self._params_version = version
        return self._dparams

    def warmup(self, prompt_len: int, greedy: bool = False, filtered: bool = False, n_top: int = 0) -> None:
        """Compile the prefill and chunk programs a load of `prompt_len`-token prompts can use (a server
        compiles them on first use otherwise; benches call this so that compiles stay out of timings)."""
        p = [1] * int(prompt_len)
        nb = 1  # prompts per replica; slots 0..n-1 spread over the replicas
        while True:
            n = min(nb * self.replicas, self.slots)
            self.prefill([p] * n, list(range(n)))
            if nb >= self.max_prefill:
                break
            nb = min(nb * 2, self.max_prefill)
        s = self.slots
        z = lambda dt, v=0: np.full((s,), v, dt)  # noqa: E731
        w = 1
        while True:
            live = np.zeros((s,), bool)
            live[: w * self.replicas] = True
            for steps in sorted({self.chunk, self.long_chunk}):
                self.decode(z(np.int32, 1), z(np.int32), live, z(np.uint32), z(np.float32, 0.0 if greedy else 1.0),
                            z(np.int32, -1), z(np.float32, 1.0), z(np.int32, 1), np.full((s, 4), -1, np.int32),
                            greedy=greedy, filtered=filtered, n_top=n_top, steps=steps)
            if w >= self.per_replica:
                break
            w = min(w * 4, self.per_replica)

    def fits(self, prompt_len: int, max_new: int) -> bool:
        """Whether a request fits one slot's cache."""
        return _prompt_bucket(prompt_len, self.min_prompt_bucket) + max_new <= self.max_len

    def prefill(self, prompts: list[list[int]], slot_ids: list[int]) -> None:
        """Write `prompts` into slots `slot_ids` (up to max_prefill per replica at once; the caller splits).

        Each replica prefills only the prompts of its own slots ([R, nb, P], split over the replicas),
        so a prompt costs one device's work, not every replica's."""
        r = self.replicas
        rep = [s % r for s in slot_ids]
        # Rows per replica: a power of two (a prefill's cost is its padded rows; 7 prompts padded to 16 cost 2.3x)
        nb = min(_bucket(max(rep.count(k) for k in range(r))), self.max_prefill)
        p_len = _prompt_bucket(max(len(p) for p in prompts), self.min_prompt_bucket)
        ids = np.zeros((r, nb, p_len), np.int32)
        mask = np.zeros((r, nb, p_len), np.int32)
        mask[:, :, -1] = 1  # filler rows: one real token so their attention is well defined
        where = np.full((r, nb), self.per_replica, np.int32)  # out of range: dropped by the scatter
        fill = [0] * r
        for p, s in zip(prompts, slot_ids):
            k, j = s % r, fill[s % r]
            fill[k] += 1
            ids[k, j, p_len - len(p):] = p
            mask[k, j, p_len - len(p):] = 1
            where[k, j] = s // r
        program = _jitted_prefill(self.cfg, self.max_len, self.engine.cache_dtype, self._mesh)
        put = functools.partial(jax.device_put, device=self._rows)
        head = np.full((r,), self.head, np.int32)
        self.state, self.logits = program(self.params(), self.state, self.logits, put(ids), put(mask), put(where), put(head))
        self.prefills += 1

    def decode(self, pos: np.ndarray, t: np.ndarray, live: np.ndarray, seeds: np.ndarray, temperature: np.ndarray,
               top_k: np.ndarray, top_p: np.ndarray, max_new: np.ndarray, stops: np.ndarray, *, greedy: bool,
               filtered: bool, n_top: int, steps: int | None = None) -> tuple[np.ndarray, ...]:
        """One chunk over the slots below the highest live one. Per-slot host arrays [S, ...] in slot order;
        returns numpy in slot order (tokens [S, chunk], log-probs, emitted [S, chunk], live [S], stopped
        [S], top ids, top log-probs); slots past the width come back as not emitted."""
        r, per = self.replicas, self.per_replica
        width = _coarse(int(np.flatnonzero(live).max()) // r + 1, per) if live.any() else 1

        def to_dev(a: np.ndarray) -> np.ndarray:  # [S, ...] slot order -> [R, width, ...]
            return np.swapaxes(a.reshape((per, r) + a.shape[1:]), 0, 1)[:, :width]

        def to_host(a: np.ndarray) -> np.ndarray:  # [R, width, ...] -> [S, ...] slot order, zero-filled
            full = np.zeros((r, per) + a.shape[2:], a.dtype)
            full[:, :width] = a
            return np.swapaxes(full, 0, 1).reshape((self.slots,) + a.shape[2:])

        steps = self.chunk if steps is None else int(steps)
        program = _jitted_chunk(self.cfg, self.vocab_limit, steps, greedy, filtered, n_top, width, self._mesh)
        # Two host->device transfers per chunk (ints, floats), not one per knob: each is a round trip per replica.
        ints = np.concatenate([np.stack([pos, t, live, seeds.view(np.int32), top_k, max_new], axis=1).astype(np.int32),
                               stops.astype(np.int32)], axis=1)
        floats = np.stack([temperature, top_p], axis=1).astype(np.float32)
        rows = [jax.device_put(np.ascontiguousarray(to_dev(a)), self._rows) for a in (ints, floats)]
        head = jax.device_put(np.full((r,), self.head, np.int32), self._rows)
        self.state, self.logits, *outs = program(self.params(), self.state, self.logits, *rows, head)
        self.head = (self.head + steps) % self.max_len
        self.steps += 1
        return tuple(to_host(np.asarray(x)) for x in jax.device_get(outs))


@functools.lru_cache(maxsize=None)
def _jitted_decode_params(cfg: models.ModelConfig):
    return jax.jit(functools.partial(models.decode_params, cfg))


def _per_replica(fn: Callable, mesh: Any, n_args: int) -> Callable:
    """`fn` over [R, ...] arrays: as it is on one device (R = 1), else under `shard_map` so that each
    replica runs its own rows as a one-device program (no SPMD partitioning of a decode step, no
    communication), as `JaxEngine` does; the first argument (weights) is replicated."""
    if mesh is None:
        return fn
    from jax.sharding import PartitionSpec as P

    rows = P("replica")
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(),) + (rows,) * (n_args - 1), out_specs=rows, check_vma=False)


@functools.lru_cache(maxsize=None)
def _jitted_prefill(cfg: models.ModelConfig, max_len: int, cache_dtype: str | None, mesh: Any):
    def prefill(params, state, logits, ids, mask, where, head):
        # One replica's view: state [1, per, ...], ids/mask [1, nb, P], where [1, nb] (slot within the
        # replica), head [1]. The prompt's keys/values go in the P ring columns just behind the head.
        ids, mask, where, g = ids[0], mask[0], where[0], head[0]
        nb, p_len = ids.shape
        st = models.init_decode_state(cfg, nb, p_len, cache_dtype)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
        # All but the last column first: their logits are dead code, so XLA drops the unembedding.
        _, st = models.decode(cfg, params, ids[:, :-1], positions[:, :-1], st, mask[:, :-1])
        lg, st = models.decode(cfg, params, ids[:, -1:], positions[:, -1:], st, mask[:, -1:])

        def place(big, new, axis):  # [nb, ..., P at axis] -> columns [g - P, g) mod max_len of rows `where`
            pad = [(0, 0)] * new.ndim
            pad[axis] = (max_len - p_len, 0)
            new = jnp.roll(jnp.pad(new, pad), g, axis=axis)
            return big.at[0, where].set(new.astype(big.dtype), mode="drop")

        layers_ = {n: {"k": place(c["k"], st["layers"][n]["k"], 3), "v": place(c["v"], st["layers"][n]["v"], 2)}
                   for n, c in state["layers"].items()}
        new_state = {"layers": layers_, "kv_mask": place(state["kv_mask"], st["kv_mask"], 1)}
        return new_state, logits.at[0, where].set(lg[:, 0], mode="drop")

    return jax.jit(_per_replica(prefill, mesh, 7), donate_argnums=(1, 2))


def _ring_step(cfg: models.ModelConfig, params: Any, state: dict[str, Any], tok: jax.Array, pos: jax.Array,
               live: jax.Array, g: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
    """One decode step of every row (`models.qwen3.decode` for one token, batched): row b's token at
    RoPE position pos[b] goes in ring column g of its cache; it attends to its row's valid columns
    (kv_mask), whatever their order (keys carry their positions). Returns logits [B, V] and the state."""
    from mpa_jax.models import layers, qwen3

    kv_mask = jax.lax.dynamic_update_slice(state["kv_mask"], live[:, None], (0, g))
    mask = kv_mask[:, None, None, :]
    cos, sin = layers.rope_tables(pos[:, None], cfg.head_dim, cfg.rope_theta)
    x = qwen3._embed(cfg, params, tok[:, None])
    all_layers = qwen3.layer_params(cfg, params)
    new_layers = {}
    for n in range(cfg.num_hidden_layers):
        p = all_layers[str(n)]
        cache = state["layers"][str(n)]
        h = layers.rms_norm(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        q, k, v = qwen3._qkv_fused(cfg, p["self_attn"], h, cos, sin)
        ck = jax.lax.dynamic_update_slice(cache["k"], k.transpose(0, 2, 3, 1).astype(cache["k"].dtype), (0, 0, 0, g))
        cv = jax.lax.dynamic_update_slice(cache["v"], v.transpose(0, 2, 1, 3).astype(cache["v"].dtype), (0, 0, g, 0))
        new_layers[str(n)] = {"k": ck, "v": cv}
        attn = layers.cached_attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask, cfg.head_dim**-0.5)
        x = qwen3._mlp_fused(cfg, p, x + qwen3._out(p["self_attn"], attn))
    x = layers.rms_norm(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)
    w = qwen3.decode_unembedding(cfg, params).astype(x.dtype)
    logits = jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)
    return logits[:, 0], {"layers": new_layers, "kv_mask": kv_mask}


@functools.lru_cache(maxsize=None)
def _jitted_chunk(cfg: models.ModelConfig, vocab_limit: int, chunk: int, greedy: bool, filtered: bool, n_top: int,
                  width: int, mesh: Any):
    def run(params, full_state, full_logits, ints, floats, head):
        # [R, width, ...] -> [R * width, ...]: the slots of this chunk as one batch (R = 1 per replica).
        r = full_logits.shape[0]
        flat = lambda x: x.reshape((r * width,) + x.shape[2:])  # noqa: E731
        full = width == full_logits.shape[1]  # no prefix to cut out (and no copy of the caches)
        state = jax.tree.map(lambda x: flat(x if full else x[:, :width]), full_state)
        logits = flat(full_logits if full else full_logits[:, :width])
        ints, floats = flat(ints), flat(floats)
        pos, t, live, top_k, max_new = ints[:, 0], ints[:, 1], ints[:, 2] != 0, ints[:, 4], ints[:, 5]
        seeds, stops = jax.lax.bitcast_convert_type(ints[:, 3], jnp.uint32), ints[:, 6:]
        temperature, top_p = floats[:, 0], floats[:, 1]
        s = r * width
        keys = jax.vmap(jax.random.key)(seeds)
        toks = jnp.zeros((s, chunk), jnp.int32)
        lps = jnp.zeros((s, chunk), jnp.float32)
        emitted = jnp.zeros((s, chunk), bool)
        stopped = jnp.zeros((s,), bool)
        tops = (jnp.zeros((s, chunk, n_top), jnp.int32), jnp.zeros((s, chunk, n_top), jnp.float32)) if n_top else ()

        def body(k, carry):
            state, logits, pos, t, live, stopped, g, toks, lps, emitted, *tops = carry
            picked = sampling.sample_step(sampling.mask_vocab(logits, vocab_limit), keys, t, temperature, top_k, top_p,
                                          greedy=greedy, filtered=filtered, mixed=not greedy, n_top=n_top)
            tok = jnp.where(live, picked[0], 0)
            toks = toks.at[:, k].set(tok)
            lps = lps.at[:, k].set(jnp.where(live, picked[1], 0.0))
            emitted = emitted.at[:, k].set(live)
            if n_top:
                tops = [tops[0].at[:, k].set(picked[2]), tops[1].at[:, k].set(picked[3])]
            hit = live & jnp.any(tok[:, None] == stops, axis=1)
            t = t + live.astype(jnp.int32)
            stopped = stopped | hit
            live = live & ~hit & (t < max_new)
            # Every slot steps (static shapes); finished and free ones write masked-out cache columns.
            logits, state = _ring_step(cfg, params, state, tok, pos, live, g)
            pos = pos + live.astype(jnp.int32)
            return (state, logits, pos, t, live, stopped, (g + 1) % max_len, toks, lps, emitted, *tops)

        max_len = full_state["kv_mask"].shape[-1]
        # A trip count XLA cannot see (it is `chunk`): with a static one XLA:CPU unrolls the loop and
        # copies every cache of the carry each step (measured: a 16-row chunk cost as much as a 32-row one).
        # A replica with no live row runs no step: on CPU its idle program would take cores from the busy one.
        n_steps = jnp.where(live.any(), jnp.minimum(chunk, max_len + head[0]), 0)
        carry = jax.lax.while_loop(lambda c: c[0] < n_steps, lambda c: (c[0] + 1, *body(c[0], c[1:])),
                                   (jnp.int32(0), state, logits, pos, t, live, stopped, head[0], toks, lps, emitted, *tops))[1:]
        unflat = lambda x: x.reshape((r, width) + x.shape[1:])  # noqa: E731
        if full:
            state, logits = jax.tree.map(unflat, carry[0]), unflat(carry[1])
        else:
            # dynamic_update_slice, not .at[].set (a scatter): XLA then writes the prefix in place
            # instead of copying every cache first.
            put = lambda big, new: jax.lax.dynamic_update_slice(big, unflat(new).astype(big.dtype), (0,) * big.ndim)  # noqa: E731
            state = jax.tree.map(put, full_state, carry[0])
            logits = put(full_logits, carry[1])
        return (state, logits, *(unflat(x) for x in (carry[7], carry[8], carry[9], carry[4], carry[5], *carry[10:])))

    return jax.jit(_per_replica(run, mesh, 6), donate_argnums=(1, 2))


class SlotLoop:
    """The host loop over a `SlotDecoder` on its own thread (see the module docstring).

    `submit(request)` is thread-safe; `request.on_update` is called on the loop's thread with each
    request's new tokens after every chunk, and once with the final `GenerateResult`. `idle` tells
    whether nothing is queued or running. `paused()` is a context manager that holds the loop between
    chunks (weight updates).
    """

    def __init__(self, decoder: SlotDecoder) -> None:
        self.dec = decoder
        s = decoder.slots
        self._queue: "queue.SimpleQueue[SlotRequest]" = queue.SimpleQueue()
        self._waiting: list[SlotRequest] = []
        self._slot: list[SlotRequest | None] = [None] * s
        self._pos = np.zeros((s,), np.int32)
        self._t = np.zeros((s,), np.int32)
        self._live = np.zeros((s,), bool)
        self._seeds = np.zeros((s,), np.uint32)
        self._temperature = np.zeros((s,), np.float32)
        self._top_k = np.full((s,), -1, np.int32)
        self._top_p = np.ones((s,), np.float32)
        self._max_new = np.ones((s,), np.int32)
        self._n_stop = 4
        self._stops = np.full((s, self._n_stop), -1, np.int32)
        self._wake = threading.Event()
        self._gate = threading.Lock()  # held by the loop while it works; pause() takes it
        self._stop = False
        self.pending = 0  # requests submitted and not finished
        self.admitted = 0  # requests admitted into slots
        self.fallback_rows = 0  # requests too long for a slot, run through engine.generate_rows
        self.cancelled_rows = 0  # requests ended early by their consumer
        # Where the loop's time goes (seconds): admission (prefill included), decode chunks (device
        # time plus the host round trip), handing results out; and rows live at each chunk's start.
        self.seconds = {"admit": 0.0, "decode": 0.0, "deliver": 0.0}
        self.live_rows = 0  # summed over chunks: mean occupancy = live_rows / dec.steps
        self._churn = False  # a request was admitted or retired since the last chunk
        self._thread = threading.Thread(target=self._run, name="mpa-slots", daemon=True)
        self._thread.start()

    # ---- public ------------------------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        self.pending += 1  # GIL-atomic enough for a counter read only as a hint (busy/idle)
        self._queue.put(request)
        self._wake.set()

    @property
    def idle(self) -> bool:
        return self.pending == 0

    def paused(self):
        """Hold the loop between chunks while the `with` block runs."""
        return self._gate

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)

    # ---- loop --------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            if not self._live.any() and self._queue.empty() and not self._waiting:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            with self._gate:
                try:
                    t0 = time.perf_counter()
                    self._admit()
                    self.seconds["admit"] += time.perf_counter() - t0
                    if self._live.any():
                        self._step()
                except Exception as e:  # noqa: BLE001 - every running request gets the error, the loop goes on
                    log.exception("slot loop failed")
                    self._fail_all(e)

    def _finish(self, req: SlotRequest, result: GenerateResult | None, error: BaseException | None = None,
                new: tuple[list[int], list[float], Any] = ([], [], None)) -> None:
        self.pending -= 1
        try:
            req.on_update(Update(new[0], new[1], new[2], result=result, error=error))
        except Exception:  # noqa: BLE001 - a consumer's failure must not stop the loop
            log.exception("slot loop: on_update failed")

    def _fail_all(self, e: BaseException) -> None:
        for s, req in enumerate(self._slot):
            if req is not None:
                self._slot[s] = None
                self._live[s] = False
                self._finish(req, None, e)
        for req in self._waiting:
            self._finish(req, None, e)
        self._waiting = []

    def _admit(self) -> None:
        while not self._queue.empty():
            self._waiting.append(self._queue.get())
        # Cancelled before they started: answered with no tokens.
        for req in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(req)
            self.cancelled_rows += 1
            self._finish(req, self._result(req, "length"))
        # Too long for a slot: the engine's own program, here between chunks.
        big = [r for r in self._waiting if not self.dec.fits(len(r.prompt), r.params.max_new_tokens)]
        if big:
            self._waiting = [r for r in self._waiting if r not in big]
            try:
                out = self.dec.engine.generate_rows([r.prompt for r in big], [r.params for r in big], [r.seed for r in big],
                                                    max(r.top_logprobs for r in big))
            except Exception as e:  # noqa: BLE001 - delivered to those requests
                for r in big:
                    self._finish(r, None, e)
            else:
                self.fallback_rows += len(big)
                for r, res in zip(big, out):
                    self._finish(r, res, new=(res.token_ids, res.logprobs, res.top_logprobs))
        free = [s for s in range(self.dec.slots) if self._slot[s] is None]
        if not free or not self._waiting:
            return
        take = self._waiting[: len(free)]
        self._waiting = self._waiting[len(free):]
        self._churn = True
        # One prefill per prompt bucket: a prompt padded to a longer neighbour's width could overflow its slot.
        by_width: dict[int, list[SlotRequest]] = {}
        for r in take:
            by_width.setdefault(_prompt_bucket(len(r.prompt), self.dec.min_prompt_bucket), []).append(r)
        reps = self.dec.replicas
        for same in by_width.values():
            slots, free = free[: len(same)], free[len(same):]
            # Prefill calls of up to max_prefill prompts per replica (slot s lives on replica s % R).
            group: list[tuple[int, SlotRequest]] = []
            count = [0] * reps
            for s, r in zip(slots, same):
                if count[s % reps] == self.dec.max_prefill:
                    self._prefill(group)
                    group, count = [], [0] * reps
                group.append((s, r))
                count[s % reps] += 1
            self._prefill(group)
        self.admitted += len(take)

    def _prefill(self, group: list[tuple[int, SlotRequest]]) -> None:
        self.dec.prefill([r.prompt for _, r in group], [s for s, _ in group])
        for s, r in group:
            self._place(s, r)

    def _place(self, s: int, r: SlotRequest) -> None:
        sp = r.params
        self._slot[s] = r
        self._pos[s] = len(r.prompt)
        self._t[s] = 0
        self._live[s] = True
        self._seeds[s] = r.seed % (2**32)
        self._temperature[s] = sp.temperature
        self._top_k[s] = sp.top_k
        self._top_p[s] = sp.top_p
        self._max_new[s] = sp.max_new_tokens
        if len(sp.stop_token_ids) > self._n_stop:  # more stop ids than columns: widen (one recompile)
            self._n_stop = _bucket(len(sp.stop_token_ids))
            wider = np.full((self.dec.slots, self._n_stop), -1, np.int32)
            wider[:, : self._stops.shape[1]] = self._stops
            self._stops = wider
        self._stops[s] = -1
        self._stops[s, : len(sp.stop_token_ids)] = sp.stop_token_ids

    def _step(self) -> None:
        live_reqs = [r for r in self._slot if r is not None]
        greedy = all(r.params.greedy for r in live_reqs)
        filtered = not greedy and any(r.params.filtered and not r.params.greedy for r in live_reqs)
        want = max(r.top_logprobs for r in live_reqs)
        n_top = _bucket(want) if want else 0
        self.live_rows += len(live_reqs)
        t0 = time.perf_counter()
        toks, lps, emitted, live, stopped, *tops = self.dec.decode(
            self._pos, self._t, self._live, self._seeds, self._temperature, self._top_k, self._top_p, self._max_new,
            self._stops, greedy=greedy, filtered=filtered, n_top=n_top, steps=self._steps_next())
        t1 = time.perf_counter()
        self.seconds["decode"] += t1 - t0
        self._deliver(toks, lps, emitted, live, stopped, tops)
        self.seconds["deliver"] += time.perf_counter() - t1

    def _deliver(self, toks: np.ndarray, lps: np.ndarray, emitted: np.ndarray, live: np.ndarray, stopped: np.ndarray,
                 tops: list[np.ndarray]) -> None:
        """Hand each running request its new tokens; retire the finished and cancelled ones."""
        for s, req in enumerate(self._slot):
            if req is None:
                continue
            k = int(emitted[s].sum())
            new_t = toks[s, :k].tolist()
            new_lp = lps[s, :k].tolist()
            new_top = None
            if req.top_logprobs:
                new_top = [[(int(i), float(v)) for i, v in zip(tops[0][s, j, : req.top_logprobs], tops[1][s, j, : req.top_logprobs])]
                           for j in range(k)]
                req.tops.extend(new_top)
            req.tokens.extend(new_t)
            req.logprobs.extend(new_lp)
            self._t[s] += k
            self._pos[s] += k
            done = not bool(live[s]) or req.cancelled
            if done:
                self._churn = True
                self.cancelled_rows += int(req.cancelled and bool(live[s]))
                self._slot[s] = None
                self._live[s] = False
                self._finish(req, self._result(req, "stop" if bool(stopped[s]) else "length"), new=(new_t, new_lp, new_top))
            elif k and req.updates:
                try:
                    req.on_update(Update(new_t, new_lp, new_top))
                except Exception:  # noqa: BLE001
                    log.exception("slot loop: on_update failed")

    def _steps_next(self) -> int:
        """The long chunk for a lone settled request: one request running, nothing admitted or retired
        at this boundary (a client whose request just ended tends to come back within milliseconds),
        none waiting, and at least that many tokens of budget left. With more requests running, one that
        ends on a stop token mid-chunk would hold its slot (and its client) for the rest of the chunk."""
        dec = self.dec
        churn, self._churn = self._churn, False
        if dec.long_chunk == dec.chunk or churn or self._waiting or not self._queue.empty():
            return dec.chunk
        left = (self._max_new - self._t)[self._live]
        return dec.long_chunk if left.size == 1 and int(left[0]) >= dec.long_chunk else dec.chunk

    def _result(self, req: SlotRequest, finish: str) -> GenerateResult:
        toks = req.tokens
        return GenerateResult(
            token_ids=list(toks), logprobs=list(req.logprobs), finish_reason=finish,
            matched_stop=toks[-1] if finish == "stop" and toks else None, prompt_tokens=len(req.prompt),
            weight_version=self.dec.engine.weight_version, top_logprobs=list(req.tops) if req.top_logprobs else None)


def timed_wait(pred: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `pred` until true or timeout (tests and shutdown)."""
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True
