"""Slot decoding: the engine's rows, each a request that joins and leaves the running batch between chunks.

`SlotDecoder` keeps a fixed number of *slots* (rows of a batched decode state of `max_len` ring columns,
`models.init_slot_state`) and three kinds of jitted programs, all written against the model-family
functions (`models.prefill_slots`, `models.decode_slots`), so every family runs here:

- `prefill`: writes up to `max_prefill` new prompts per replica (left-padded to a prompt bucket) into
  free slots (their cache rows, recurrent states and next-token logits); other slots are untouched.
- `decode chunk`: `chunk` decode steps over the slots in use (a prefix of each replica's slots), each
  slot with its own temperature, top-k/top-p, seed, step counter, stop ids and token budget (the
  vocabulary rule applies: ids >= `vocab_limit` are never sampled). A slot stops on a stop id or its
  budget; finished and free slots ride along masked.
- `decode_params`: the weights prepared once per weight version (`set_weights`).

The caches are rings: every step writes column `head` of every row and advances the head, so slots at
different lengths share one write column; a prompt is placed in the columns just behind the head when
it is admitted. A live row's tokens are therefore the last `prompt bucket + tokens so far` columns
behind the head, and a chunk attends over a *window* of the ring just wide enough for its longest live
row (a power of two, gathered once per chunk; the new columns are written back in place): a step's
attention costs what the rows hold, not `max_len`. A chunk never wraps the ring (max_len is a multiple
of the long chunk, and a long chunk starts only at a head aligned to it), so the write-back is one
in-place update.

`SlotLoop` is the host side: a thread that, between chunks, admits waiting requests into free slots,
hands each request its new tokens (`on_update`), resolves its future with the `GenerateResult`, retires
finished or stopped requests, and runs the next chunk. A request arriving mid-generation waits at most
one chunk plus one prefill. A lone settled request (nobody else running or waiting) runs in chunks of
`long_chunk` steps (default 4 x chunk): fewer host round trips per token. Weight updates happen between
chunks (`paused()`); every result names the weight versions its tokens came from. The thread exits
after `idle_exit_s` without work (an engine nobody uses holds no thread) and restarts on the next
request.

Token t of a request is drawn from `fold_in(key(seed), t)` as in the whole-batch program
(`jax_engine.generate_batch`), so a request's tokens do not depend on what else runs (up to float
rounding between batch shapes). With engine replicas (CPU: one device per core) the slots are split
over those devices and every program runs per replica under `shard_map` (no SPMD partitioning, no
communication); with a mesh the programs are plain jits over the sharded weights. Requests that do not
fit a slot (prompt bucket + max_new_tokens > max_len) run through the whole-batch program (`fallback`)
between chunks.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout import sampling
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams, Update

log = logging.getLogger(__name__)

__all__ = ["SlotDecoder", "SlotLoop", "SlotRequest", "GenerationFuture", "Update", "slot_support", "SUPPORTED_FAMILIES"]

SUPPORTED_FAMILIES = tuple(models.registry.FAMILIES)  # every family implements `decode_slots`
MIN_SPAN = 32  # narrowest attention window of a chunk (fewer distinct programs)


class CompileCounter:
    """XLA compilations made by the threads that run under `counting(counter)` (`n`)."""

    def __init__(self) -> None:
        self.n = 0


_counting = threading.local()


def _on_jax_event(event: str, duration: float, **_: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        counter = getattr(_counting, "counter", None)
        if counter is not None:
            counter.n += 1


jax.monitoring.register_event_duration_secs_listener(_on_jax_event)


class counting:
    """Context manager: compilations on this thread count into `counter` (jax compiles on the calling thread)."""

    def __init__(self, counter: CompileCounter) -> None:
        self.counter = counter

    def __enter__(self) -> CompileCounter:
        self._before = getattr(_counting, "counter", None)
        _counting.counter = self.counter
        return self.counter

    def __exit__(self, *exc: Any) -> None:
        _counting.counter = self._before


def _bucket(n: int, minimum: int = 1) -> int:
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def prompt_bucket(n: int, minimum: int, step: int = 256) -> int:
    """Prefill width: a power of two up to `step`, then a multiple of `step` (long prompts waste little of a
    slot; a larger step compiles fewer prefill programs, which is what counts on an accelerator)."""
    b = _bucket(n, minimum)
    return b if b <= step else -(-int(n) // step) * step


def _rows(n: int, base: int, cap: int) -> int:
    """Prefill rows for `n` prompts: the smallest power of `base` >= n, capped."""
    b = 1
    while b < n:
        b *= base
    return min(b, cap)


def _coarse(n: int, cap: int) -> int:
    """Smallest power of four >= n, capped: few distinct batch widths, so few compiled programs."""
    return _rows(n, 4, cap)


_prompt_bucket = prompt_bucket  # the name bench/serve.py used


def slot_support(engine: Any) -> str | None:
    """None when `engine` decodes in slots (the embedded engine, any model family), else why not."""
    from mpa_jax.rollout.jax_engine import Engine

    if not isinstance(engine, Engine):
        return f"{type(engine).__name__} is not the embedded engine"
    if engine.cfg.family not in SUPPORTED_FAMILIES:
        return f"model family {engine.cfg.family!r} has no slot decoding (supported: {', '.join(SUPPORTED_FAMILIES)})"
    return None


@dataclasses.dataclass(eq=False)
class SlotRequest:
    """One row to generate. `on_update` (optional) is called from the loop's thread after every chunk
    with the new tokens when `updates`, else once with the result; `future` gets the result. Set
    `cancelled` to end it early (its result then carries the tokens so far, finish_reason "length").
    `versions`: the weight versions its tokens came from, in order."""

    prompt: list[int]
    params: SamplingParams
    seed: int
    top_logprobs: int = 0
    on_update: Callable[[Update], None] | None = None
    updates: bool = True
    cancelled: bool = False
    future: "GenerationFuture | None" = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    tops: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    versions: list[str] = dataclasses.field(default_factory=list)


class GenerationFuture(concurrent.futures.Future):
    """The `GenerateResult` of one submitted request. `cancel()` drops it while it waits for a slot;
    `stop()` ends it while it runs (the result holds the tokens so far, finish_reason "length")."""

    def __init__(self, request: SlotRequest) -> None:
        super().__init__()
        self.request = request
        request.future = self

    def stop(self) -> None:
        self.request.cancelled = True


class SlotDecoder:
    """Device state and programs for `slots` rows of up to `max_len` tokens each (module docstring).

    `replica_mesh`: a 1-D ("replica",) mesh over R devices, each holding a copy of the weights and
    S / R slots (programs per replica under shard_map); `mesh`: the engine's sharding mesh (weights
    sharded by rules; the slot state replicated over it); neither: one device.
    """

    def __init__(self, cfg: models.ModelConfig, *, slots: int, max_len: int, chunk: int = 8, vocab_limit: int | None = None,
                 cache_dtype: str | None = None, replica_mesh: Any = None, mesh: Any = None, min_prompt_bucket: int = 16,
                 max_prefill: int = 16, long_chunk: int | None = None, prefill_step: int = 256,
                 prefill_row_base: int = 2) -> None:
        if cfg.family not in SUPPORTED_FAMILIES:
            raise ValueError(f"SlotDecoder: model family {cfg.family!r} has no slot decoding")
        if chunk < 1 or max_len < 2:
            raise ValueError(f"SlotDecoder: chunk must be >= 1 and max_len >= 2, got {chunk}, {max_len}")
        if prefill_step < 1 or prefill_step & (prefill_step - 1) or prefill_row_base not in (2, 4):
            raise ValueError(f"SlotDecoder: prefill_step must be a power of two and prefill_row_base 2 or 4, got "
                             f"{prefill_step}, {prefill_row_base}")
        self.cfg = cfg
        self.replicas = int(replica_mesh.devices.size) if replica_mesh is not None else 1
        # Slots live as [replicas, per_replica]; slot s is (s % R, s // R), so the lowest slots (the ones
        # the loop fills first) are spread over the replicas, and a chunk runs only over a prefix of
        # each replica's slots wide enough for the busiest one (`width`): a lone request costs a
        # 1-row step, not a step over every slot.
        self.per_replica = _bucket(-(-max(int(slots), 1) // self.replicas))
        self.slots = self.per_replica * self.replicas
        self.chunk = int(chunk)
        self.long_chunk = max(int(long_chunk) if long_chunk is not None else 4 * self.chunk, self.chunk)
        if self.long_chunk % self.chunk:
            raise ValueError(f"SlotDecoder: long_chunk {self.long_chunk} must be a multiple of chunk {self.chunk}")
        # A multiple of the long chunk, so that no chunk wraps the ring (see `steps_at`).
        self.max_len = -(-int(max_len) // self.long_chunk) * self.long_chunk
        self.min_prompt_bucket = int(min_prompt_bucket)
        self.max_prefill = _bucket(max_prefill)
        # Prefill shape buckets (widths x rows): each is a compiled program, 11-23 s at Qwen3-1.7B shape on an
        # H200 (docs/perf.md), so accelerator configs coarsen both (rollout.prefill_step, prefill_row_base).
        self.prefill_step = int(prefill_step)
        self.prefill_row_base = int(prefill_row_base)
        self.vocab_limit = int(vocab_limit) if vocab_limit is not None else int(cfg.vocab_size)
        self.cache_dtype = cache_dtype
        from jax.sharding import NamedSharding, PartitionSpec

        self._shard_map_mesh = replica_mesh  # programs per replica under shard_map (None: one program)
        if replica_mesh is not None:
            self._rows = NamedSharding(replica_mesh, PartitionSpec("replica"))
            self._out = None
        elif mesh is not None:
            self._rows = self._out = NamedSharding(mesh, PartitionSpec())
        else:
            self._rows = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            self._out = None
        self._dparams: Any = None
        self.version = ""
        state = jax.eval_shape(lambda: models.init_slot_state(cfg, self.per_replica, self.max_len, cache_dtype))
        self.state = jax.device_put(jax.tree.map(lambda s: jnp.zeros((self.replicas,) + s.shape, s.dtype), state), self._rows)
        self.logits = jax.device_put(jnp.zeros((self.replicas, self.per_replica, cfg.vocab_size), jnp.float32), self._rows)
        self.head = 0  # the ring's next write column (host copy; every chunk advances it by its steps)
        self.prefills = 0  # prefill program calls
        self.steps = 0  # decode chunk calls

    # ---- weights and shapes ---------------------------------------------------------------------------

    def set_weights(self, params: Any, version: str) -> None:
        """Prepare `params` (placed as the programs expect) for decoding; labels later tokens `version`."""
        self._dparams = _jitted_decode_params(self.cfg)(params)
        self.version = str(version)

    @property
    def ready(self) -> bool:
        return self._dparams is not None

    def width(self, prompt_len: int) -> int:
        """The prefill width (prompt bucket) of a `prompt_len`-token prompt."""
        return prompt_bucket(prompt_len, self.min_prompt_bucket, self.prefill_step)

    def fits(self, prompt_len: int, max_new: int) -> bool:
        """Whether a request fits one slot's ring."""
        return self.width(prompt_len) + max_new <= self.max_len

    def steps_at(self, long: bool) -> int:
        """Steps of the next chunk: the long chunk only from a head aligned to it (no chunk wraps the ring)."""
        return self.long_chunk if long and self.head % self.long_chunk == 0 else self.chunk

    def span(self, needed: int) -> int:
        """Attention window of a chunk whose rows hold at most `needed` columns (chunk columns included)."""
        return min(_bucket(needed, MIN_SPAN), self.max_len)

    def warmup(self, prompt_len: int, max_new: int, greedy: bool = False, filtered: bool = False, n_top: int = 0) -> int:
        """Compile the prefill and chunk programs a load of `prompt_len`-token prompts with `max_new` new
        tokens can use (otherwise compiled on first use; benches call this so compiles stay out of
        timings). Returns the number of chunk programs run."""
        p = [1] * int(prompt_len)
        nb = 1  # prompts per replica; slots 0..n-1 spread over the replicas
        while True:
            n = min(nb * self.replicas, self.slots)
            self.prefill([p] * n, list(range(n)))
            if nb >= self.max_prefill:
                break
            nb = min(nb * self.prefill_row_base, self.max_prefill)
        s = self.slots
        z = lambda dt, v=0: np.full((s,), v, dt)  # noqa: E731
        width = self.width(prompt_len)
        # The windows `SlotLoop._step` can ask for: the columns a row holds (prompt bucket + tokens so far) plus a chunk.
        spans = {steps: sorted({self.span(n + steps) for n in range(width, width + max_new + 1)})
                 for steps in {self.chunk, self.long_chunk}}
        runs, w = 0, 1
        head = self.head
        while True:
            live = np.zeros((s,), bool)
            live[: w * self.replicas] = True
            for steps in sorted(spans):
                for span in spans[steps]:
                    self.head = 0
                    self.decode(z(np.int32, 1), z(np.int32), live, z(np.uint32), z(np.float32, 0.0 if greedy else 1.0),
                                z(np.int32, -1), z(np.float32, 1.0), z(np.int32, 1), np.full((s, 4), -1, np.int32),
                                greedy=greedy, filtered=filtered, n_top=n_top, steps=steps, span=span)
                    runs += 1
            if w >= self.per_replica:
                break
            w = min(w * 4, self.per_replica)
        self.head = head
        return runs

    # ---- programs -------------------------------------------------------------------------------------

    def prefill(self, prompts: list[list[int]], slot_ids: list[int]) -> None:
        """Write `prompts` into slots `slot_ids` (up to max_prefill per replica at once; the caller splits).

        Each replica prefills only the prompts of its own slots ([R, nb, P], split over the replicas),
        so a prompt costs one device's work, not every replica's."""
        r = self.replicas
        rep = [s % r for s in slot_ids]
        # Rows per replica: a power of two (a prefill's cost is its padded rows; 7 prompts padded to 16 cost 2.3x)
        nb = _rows(max(rep.count(k) for k in range(r)), self.prefill_row_base, self.max_prefill)
        p_len = self.width(max(len(p) for p in prompts))
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
        program = _jitted_prefill(self.cfg, self.cache_dtype, self._shard_map_mesh, self._out)
        put = functools.partial(jax.device_put, device=self._rows)
        head = np.full((r,), self.head, np.int32)
        self.state, self.logits = program(self._dparams, self.state, self.logits, put(ids), put(mask), put(where), put(head))
        self.prefills += 1

    def decode(self, pos: np.ndarray, t: np.ndarray, live: np.ndarray, seeds: np.ndarray, temperature: np.ndarray,
               top_k: np.ndarray, top_p: np.ndarray, max_new: np.ndarray, stops: np.ndarray, *, greedy: bool,
               filtered: bool, n_top: int, steps: int | None = None, span: int | None = None) -> tuple[np.ndarray, ...]:
        """One chunk over the slots below the highest live one, attending over the last `span` ring
        columns (default: the whole ring). Per-slot host arrays [S, ...] in slot order; returns numpy
        in slot order (tokens [S, steps], log-probs, emitted [S, steps], live [S], stopped [S], top
        ids, top log-probs); slots past the width come back as not emitted."""
        r, per = self.replicas, self.per_replica
        width = _coarse(int(np.flatnonzero(live).max()) // r + 1, per) if live.any() else 1

        def to_dev(a: np.ndarray) -> np.ndarray:  # [S, ...] slot order -> [R, width, ...]
            return np.swapaxes(a.reshape((per, r) + a.shape[1:]), 0, 1)[:, :width]

        def to_host(a: np.ndarray) -> np.ndarray:  # [R, width, ...] -> [S, ...] slot order, zero-filled
            full = np.zeros((r, per) + a.shape[2:], a.dtype)
            full[:, :width] = a
            return np.swapaxes(full, 0, 1).reshape((self.slots,) + a.shape[2:])

        steps = self.chunk if steps is None else int(steps)
        span = self.max_len if span is None else int(span)
        if self.head + steps > self.max_len or not steps <= span <= self.max_len:
            raise ValueError(f"SlotDecoder.decode: {steps} steps from head {self.head} (span {span}) do not fit the ring")
        program = _jitted_chunk(self.cfg, self.vocab_limit, steps, greedy, filtered, n_top, width, span,
                                self._shard_map_mesh, self._out)
        # Two host->device transfers per chunk (ints, floats), not one per knob: each is a round trip per replica.
        ints = np.concatenate([np.stack([pos, t, live, seeds.view(np.int32), top_k, max_new], axis=1).astype(np.int32),
                               stops.astype(np.int32)], axis=1)
        floats = np.stack([temperature, top_p], axis=1).astype(np.float32)
        rows = [jax.device_put(np.ascontiguousarray(to_dev(a)), self._rows) for a in (ints, floats)]
        head = jax.device_put(np.full((r,), self.head, np.int32), self._rows)
        self.state, self.logits, *outs = program(self._dparams, self.state, self.logits, *rows, head)
        self.head = (self.head + steps) % self.max_len
        self.steps += 1
        return tuple(to_host(np.asarray(x)) for x in jax.device_get(outs))


@functools.lru_cache(maxsize=None)
def _jitted_decode_params(cfg: models.ModelConfig):
    return jax.jit(functools.partial(models.decode_params, cfg))


def _per_replica(fn: Callable, mesh: Any, n_args: int, out: Any) -> Callable:
    """`fn` over [R, ...] arrays: under `shard_map` over the replica mesh, so that each replica runs its
    own rows as a one-device program (no SPMD partitioning of a decode step, no communication); the
    first argument (weights) is replicated. Without one, `fn` as it is (R = 1), its outputs placed
    by `out` (a sharding mesh: replicated) when given."""
    if mesh is None:
        return jax.jit(fn, donate_argnums=(1, 2), out_shardings=out)
    from jax.sharding import PartitionSpec as P

    rows = P("replica")
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(P(),) + (rows,) * (n_args - 1), out_specs=rows, check_vma=False)
    return jax.jit(fn, donate_argnums=(1, 2))


@functools.lru_cache(maxsize=None)
def _jitted_prefill(cfg: models.ModelConfig, cache_dtype: str | None, mesh: Any, out: Any):
    def prefill(params, state, logits, ids, mask, where, head):
        # One replica's view: state [1, per, ...], ids/mask [1, nb, P], where [1, nb] (slot within the
        # replica), head [1]. The prompts go in the P ring columns just behind the head.
        def run(state, logits):
            one = jax.tree.map(lambda x: x[0], state)
            lg, one = models.prefill_slots(cfg, params, one, ids[0], mask[0], where[0], head[0], cache_dtype)
            return jax.tree.map(lambda x: x[None], one), logits.at[0, where[0]].set(lg, mode="drop")

        # A replica with no prompt of its own this call skips the work (its filler rows would take a
        # core from the replica that has one: a lone returning episode is the common admission).
        per = logits.shape[1]
        return jax.lax.cond(jnp.any(where[0] < per), run, lambda s, lg: (s, lg), state, logits)

    return _per_replica(prefill, mesh, 7, out)


def _window_io(cfg: models.ModelConfig, width: int, span: int, steps: int):
    """(take, put) between a replica's full slot state [R, per, ...] and a chunk's working state
    [R * width, ...]: the first `width` slots of each replica and, for ring leaves, the last
    `span - steps` columns behind the head plus the `steps` the chunk writes. `put` writes back only
    what a chunk changes (the written columns, the per-row states), in place (`dynamic_update_slice`:
    a scatter would copy every cache first)."""
    axes = models.slot_cache_axes(cfg)
    back = span - steps

    def tree_axes(state: dict[str, Any]) -> dict[str, Any]:
        return {"layers": axes, "kv_mask": 1}

    def take(state: dict[str, Any], head: jax.Array) -> dict[str, Any]:
        r, per, max_len = state["kv_mask"].shape
        cols = (head - back + jnp.arange(span)) % max_len

        def one(x: jax.Array, axis: int | None) -> jax.Array:
            x = x if width == per else x[:, :width]
            if axis is not None and span < max_len:
                x = jnp.take(x, cols, axis=axis + 1, mode="clip")  # in range already (mod max_len)
            return x.reshape((r * width,) + x.shape[2:])

        return _map_axes(one, state, tree_axes(state))

    def put(full: dict[str, Any], work: dict[str, Any], head: jax.Array) -> dict[str, Any]:
        r, per, max_len = full["kv_mask"].shape

        def one(big: jax.Array, new: jax.Array, axis: int | None) -> jax.Array:
            new = new.reshape((r, width) + new.shape[1:]).astype(big.dtype)
            start = [0] * big.ndim
            if axis is not None and span < max_len:
                new = jax.lax.dynamic_slice_in_dim(new, back, steps, axis=axis + 1)  # the columns written
                start[axis + 1] = head
            elif width == per:
                return new
            return jax.lax.dynamic_update_slice(big, new, tuple(start))

        return _map_axes(one, full, tree_axes(full), work)

    return take, put, (lambda head, max_len: back if span < max_len else head)


def _map_axes(fn: Callable, state: dict[str, Any], axes: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
    """`fn(leaf, *more_leaves, axis)` over a slot state, with each leaf's ring axis (None leaves are axes too)."""
    layers_ = {name: {leaf: fn(state["layers"][name][leaf], *(m["layers"][name][leaf] for m in more), axis)
                      for leaf, axis in leaves.items()}
               for name, leaves in axes["layers"].items()}
    return {"layers": layers_, "kv_mask": fn(state["kv_mask"], *(m["kv_mask"] for m in more), axes["kv_mask"])}


@functools.lru_cache(maxsize=None)
def _jitted_chunk(cfg: models.ModelConfig, vocab_limit: int, chunk: int, greedy: bool, filtered: bool, n_top: int,
                  width: int, span: int, mesh: Any, out: Any):
    take, put, first_column = _window_io(cfg, width, span, chunk)

    def run(params, full_state, full_logits, ints, floats, head):
        # [R, width, ...] -> [R * width, ...]: the slots of this chunk as one batch (R = 1 per replica).
        r, per = full_logits.shape[:2]
        max_len = full_state["kv_mask"].shape[-1]
        g = head[0]
        flat = lambda x: x.reshape((r * width,) + x.shape[2:])  # noqa: E731
        state = take(full_state, g)
        logits = flat(full_logits if width == per else full_logits[:, :width])
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
        col0 = first_column(g, max_len)

        def body(k, carry):
            state, logits, pos, t, live, stopped, toks, lps, emitted, *tops = carry
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
            logits, state = models.decode_slots(cfg, params, tok, pos, live, state, col0 + k)
            pos = pos + live.astype(jnp.int32)
            return (state, logits, pos, t, live, stopped, toks, lps, emitted, *tops)

        # A trip count XLA cannot see (it is `chunk`): with a static one XLA:CPU unrolls the loop and
        # copies every cache of the carry each step (measured: a 16-row chunk cost as much as a 32-row one).
        # A replica with no live row runs no step: on CPU its idle program would take cores from the busy one.
        n_steps = jnp.where(live.any(), chunk, 0)
        carry = jax.lax.while_loop(lambda c: c[0] < n_steps, lambda c: (c[0] + 1, *body(c[0], c[1:])),
                                   (jnp.int32(0), state, logits, pos, t, live, stopped, toks, lps, emitted, *tops))[1:]
        unflat = lambda x: x.reshape((r, width) + x.shape[1:])  # noqa: E731
        state = put(full_state, carry[0], g)
        if width == per:
            logits = unflat(carry[1])
        else:
            logits = jax.lax.dynamic_update_slice(full_logits, unflat(carry[1]), (0, 0, 0))
        return (state, logits, *(unflat(x) for x in (carry[6], carry[7], carry[8], carry[4], carry[5], *carry[9:])))

    return _per_replica(run, mesh, 6, out)


class SlotLoop:
    """The host loop over a `SlotDecoder` on its own thread (see the module docstring).

    `submit(request)` is thread-safe; `request.on_update` is called on the loop's thread with each
    request's new tokens after every chunk and once with the final update; `request.future` gets the
    `GenerateResult`. `idle` tells whether nothing is queued or running. `paused()` is a context
    manager that holds the loop between chunks (weight updates). `fallback(prompts, params, seeds,
    top_logprobs)` generates the requests too long for a slot.
    """

    def __init__(self, decoder: SlotDecoder, fallback: Callable[..., list[GenerateResult]] | None = None,
                 idle_exit_s: float = 2.0, compiles: CompileCounter | None = None) -> None:
        self.dec = decoder
        self.compiles = compiles if compiles is not None else CompileCounter()  # XLA compilations on the loop's thread
        self.fallback = fallback
        self.idle_exit_s = float(idle_exit_s)
        s = decoder.slots
        self._queue: "queue.SimpleQueue[SlotRequest]" = queue.SimpleQueue()
        self._waiting: list[SlotRequest] = []
        self._admitting: list[SlotRequest] = []  # taken from the queue for the prefill running now
        self._slot: list[SlotRequest | None] = [None] * s
        self._pos = np.zeros((s,), np.int32)
        self._t = np.zeros((s,), np.int32)
        self._cols = np.zeros((s,), np.int64)  # ring columns a slot's request holds (prompt bucket + steps)
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
        # Threads waiting in `paused()`: the loop lets them in before it takes the gate again (a Lock is not
        # fair: the loop could re-take it chunk after chunk while a weight update waited).
        self._pausers = 0
        self._pausers_cv = threading.Condition()
        self._life = threading.Lock()  # guards starting and ending the thread
        self._enqueue = threading.Lock()  # a group of requests enters the queue, and leaves it, at once
        self._thread: threading.Thread | None = None
        self._stop = False
        self._count = threading.Lock()  # `pending` changes on submitting threads and on the loop's
        self.pending = 0  # requests submitted and not finished
        self.admitted = 0  # requests admitted into slots
        self.finished = 0  # requests answered (results and errors)
        self.fallback_rows = 0  # requests too long for a slot, run through `fallback`
        self.cancelled_rows = 0  # requests ended early by their consumer
        # Where the loop's time goes (seconds): admission (prefill included), decode chunks (device
        # time plus the host round trip), handing results out; and rows live at each chunk's start.
        self.seconds = {"admit": 0.0, "decode": 0.0, "deliver": 0.0}
        self.live_rows = 0  # summed over chunks: mean occupancy = live_rows / dec.steps
        # Slot use, in slot-steps (one slot for one decode step): all of them, those that emitted a
        # token, and the same two over chunks that started with requests waiting for a slot.
        self.slot_steps = 0
        self.busy_slot_steps = 0
        self.queued_slot_steps = 0
        self.queued_busy_slot_steps = 0
        self.computed_slot_steps = 0
        self._churn = False  # a request was admitted or retired since the last chunk

    # ---- public ------------------------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        """Queue `request` (thread-safe); the loop's thread starts if it is not running."""
        self.submit_all([request])

    def submit_all(self, requests: list[SlotRequest]) -> None:
        """Queue `requests` as one group: the loop sees all of them at the same chunk boundary (a batch
        call on an idle loop then runs the same way every time: same slots, same chunks)."""
        with self._count:
            self.pending += len(requests)
        with self._enqueue:
            for r in requests:
                self._queue.put(r)
        with self._life:
            if self._stop:
                raise RuntimeError("SlotLoop.submit: the loop is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpa-slots", daemon=True)
                self._thread.start()
        self._wake.set()

    @property
    def idle(self) -> bool:
        return self.pending == 0

    @property
    def thread_alive(self) -> bool:
        """Whether the loop's thread is running (it ends after `idle_exit_s` without work)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def pausers(self) -> int:
        """Callers of `paused()` (weight updates) waiting for, or holding, a chunk boundary."""
        return self._pausers

    @property
    def running(self) -> int:
        """Requests in slots now."""
        return sum(r is not None for r in self._slot)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the loop between chunks while the `with` block runs (from the next chunk boundary on)."""
        with self._pausers_cv:
            self._pausers += 1
        try:
            with self._gate:
                yield
        finally:
            with self._pausers_cv:
                self._pausers -= 1
                self._pausers_cv.notify_all()

    def _let_pausers_in(self) -> None:
        with self._pausers_cv:
            self._pausers_cv.wait_for(lambda: self._pausers == 0)

    def utilisation(self) -> dict[str, float]:
        """Decode-slot use: the fraction of slot-steps that emitted a token, over all chunks and over
        chunks that started with requests waiting for a slot (every slot taken: what is idle then is the
        scheduler's doing, rows that ended mid-chunk); and of the rows the chunk programs computed (a
        prefix of the slots: idle slots past it cost nothing)."""
        return {"slot_busy": self.busy_slot_steps / self.slot_steps if self.slot_steps else 0.0,
                "computed_busy": self.busy_slot_steps / self.computed_slot_steps if self.computed_slot_steps else 0.0,
                "computed_slot_steps": float(self.computed_slot_steps),
                "slot_busy_queued": self.queued_busy_slot_steps / self.queued_slot_steps if self.queued_slot_steps else 0.0,
                "slot_steps": float(self.slot_steps), "busy_slot_steps": float(self.busy_slot_steps),
                "queued_slot_steps": float(self.queued_slot_steps), "queued_busy_slot_steps": float(self.queued_busy_slot_steps)}

    def close(self) -> None:
        """Stop the thread (requests still queued or running get an error)."""
        with self._life:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=60)

    # ---- loop --------------------------------------------------------------------------------------

    def _run(self) -> None:
        with counting(self.compiles):
            self._loop()

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            if self._stop:
                with self._gate:
                    self._fail_all(RuntimeError("the engine was closed"))
                return
            if not self._live.any() and self._queue.empty() and not self._waiting:
                with self._life:  # exit when idle long enough; a submit after this starts a new thread
                    if self._queue.empty() and time.monotonic() - idle_since > self.idle_exit_s:
                        self._thread = None
                        return
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self._let_pausers_in()
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
            idle_since = time.monotonic()

    def _finish(self, req: SlotRequest, result: GenerateResult | None, error: BaseException | None = None,
                new: tuple[list[int], list[float], Any] = ([], [], None)) -> None:
        with self._count:
            self.pending -= 1
            self.finished += 1
        if req.on_update is not None:
            try:
                req.on_update(Update(new[0], new[1], new[2], result=result, error=error))
            except Exception:  # noqa: BLE001 - a consumer's failure must not stop the loop
                log.exception("slot loop: on_update failed")
        fut = req.future
        if fut is not None and not fut.done():
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _fail_all(self, e: BaseException) -> None:
        e = _engine_error(e)
        for s, req in enumerate(self._slot):
            if req is not None:
                self._slot[s] = None
                self._live[s] = False
                self._finish(req, None, e)
        while not self._queue.empty():
            self._waiting.append(self._queue.get())
        for req in self._admitting + self._waiting:
            self._finish(req, None, e)
        self._admitting, self._waiting = [], []

    def _admit(self) -> None:
        if all(r is None for r in self._slot):
            # Idle: start the ring over, so that what runs next does not depend on what ran before
            # (which columns a row occupies changes float rounding in attention; a resumed run must
            # sample what the original run sampled).
            self.dec.head = 0
        with self._enqueue:
            arrived = []
            while not self._queue.empty():
                arrived.append(self._queue.get())
        for req in arrived:
            if req.future is not None and not req.future.set_running_or_notify_cancel():
                with self._count:  # cancelled while it waited: nobody wants its result
                    self.pending -= 1
                self.cancelled_rows += 1
                continue
            self._waiting.append(req)
        # Stopped before they started: answered with no tokens.
        for req in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(req)
            self.cancelled_rows += 1
            self._finish(req, self._result(req, "length"))
        # Too long for a slot: the whole-batch program, here between chunks.
        big = [r for r in self._waiting if not self.dec.fits(len(r.prompt), r.params.max_new_tokens)]
        if big:
            self._waiting = [r for r in self._waiting if r not in big]
            try:
                if self.fallback is None:
                    raise ValueError(f"a request of {len(big[0].prompt)} prompt + {big[0].params.max_new_tokens} new tokens"
                                     f" does not fit a slot of {self.dec.max_len}")
                out = self.fallback([r.prompt for r in big], [r.params for r in big], [r.seed for r in big],
                                    max(r.top_logprobs for r in big))
            except Exception as e:  # noqa: BLE001 - delivered to those requests
                for r in big:
                    self._finish(r, None, _engine_error(e))
            else:
                self.fallback_rows += len(big)
                for r, res in zip(big, out):
                    self._finish(r, res, new=(res.token_ids, res.logprobs, res.top_logprobs))
        free = self._free_slots()
        if not free or not self._waiting:
            return
        take = self._waiting[: len(free)]
        self._waiting = self._waiting[len(free):]
        self._admitting = list(take)  # a failing prefill answers these too (`_fail_all`)
        self._churn = True
        # One prefill per prompt bucket: a prompt padded to a longer neighbour's width could overflow its slot.
        by_width: dict[int, list[SlotRequest]] = {}
        for r in take:
            by_width.setdefault(self.dec.width(len(r.prompt)), []).append(r)
        reps = self.dec.replicas
        for width, same in by_width.items():
            slots, free = free[: len(same)], free[len(same):]
            # Prefill calls of up to max_prefill prompts per replica (slot s lives on replica s % R).
            group: list[tuple[int, SlotRequest]] = []
            count = [0] * reps
            for s, r in zip(slots, same):
                if count[s % reps] == self.dec.max_prefill:
                    self._prefill(group, width)
                    group, count = [], [0] * reps
                group.append((s, r))
                count[s % reps] += 1
            self._prefill(group, width)
        self._admitting = []
        self.admitted += len(take)

    def _free_slots(self) -> list[int]:
        """Free slots in the order to fill them: replicas in turn, the least busy first, and within a
        replica the lowest slot first (a chunk computes a prefix of each replica's slots)."""
        r = self.dec.replicas
        load = [sum(self._slot[s] is not None for s in range(k, self.dec.slots, r)) for k in range(r)]
        per_rep = [[s for s in range(k, self.dec.slots, r) if self._slot[s] is None] for k in range(r)]
        out: list[int] = []
        while any(per_rep):
            k = min((k for k in range(r) if per_rep[k]), key=lambda k: (load[k], k))
            out.append(per_rep[k].pop(0))
            load[k] += 1
        return out

    def _prefill(self, group: list[tuple[int, SlotRequest]], width: int) -> None:
        self.dec.prefill([r.prompt for _, r in group], [s for s, _ in group])
        for s, r in group:
            self._place(s, r, width)
            self._admitting.remove(r)

    def _place(self, s: int, r: SlotRequest, width: int) -> None:
        sp = r.params
        self._slot[s] = r
        self._pos[s] = len(r.prompt)
        self._t[s] = 0
        self._cols[s] = width
        self._live[s] = True
        self._seeds[s] = r.seed % (2**32)
        self._temperature[s] = sp.temperature
        self._top_k[s] = sp.top_k
        self._top_p[s] = sp.top_p
        self._max_new[s] = sp.max_new_tokens
        r.versions.append(self.dec.version)  # the prefill's weights give the first token
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
        queued = bool(self._waiting)  # requests admission could not place: every slot was taken
        steps = self.dec.steps_at(self._lone())
        span = self.dec.span(int(self._cols[self._live].max()) + steps)
        self.live_rows += len(live_reqs)
        for r in live_reqs:
            if r.versions[-1] != self.dec.version:
                r.versions.append(self.dec.version)
        t0 = time.perf_counter()
        toks, lps, emitted, live, stopped, *tops = self.dec.decode(
            self._pos, self._t, self._live, self._seeds, self._temperature, self._top_k, self._top_p, self._max_new,
            self._stops, greedy=greedy, filtered=filtered, n_top=n_top, steps=steps, span=span)
        t1 = time.perf_counter()
        self.seconds["decode"] += t1 - t0
        busy = int(emitted.sum())
        self.slot_steps += steps * self.dec.slots
        self.busy_slot_steps += busy
        width = _coarse(int(np.flatnonzero(self._live).max()) // self.dec.replicas + 1, self.dec.per_replica)
        self.computed_slot_steps += steps * width * self.dec.replicas  # rows the chunk program ran
        if queued:
            self.queued_slot_steps += steps * self.dec.slots
            self.queued_busy_slot_steps += busy
        self._cols[self._live] += steps
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
            elif k and req.updates and req.on_update is not None:
                try:
                    req.on_update(Update(new_t, new_lp, new_top))
                except Exception:  # noqa: BLE001
                    log.exception("slot loop: on_update failed")

    def _lone(self) -> bool:
        """Whether the next chunk may be long: one request running, nothing admitted or retired at this
        boundary (a client whose request just ended tends to come back within milliseconds), none
        waiting, and at least a long chunk of budget left. With more requests running, one that ends on
        a stop token mid-chunk would hold its slot (and its client) for the rest of the chunk."""
        dec = self.dec
        churn, self._churn = self._churn, False
        if dec.long_chunk == dec.chunk or churn or self._waiting or not self._queue.empty():
            return False
        left = (self._max_new - self._t)[self._live]
        return left.size == 1 and int(left[0]) >= dec.long_chunk

    def _result(self, req: SlotRequest, finish: str) -> GenerateResult:
        toks = req.tokens
        versions = req.versions or [self.dec.version]
        return GenerateResult(
            token_ids=list(toks), logprobs=list(req.logprobs), finish_reason=finish,
            matched_stop=toks[-1] if finish == "stop" and toks else None, prompt_tokens=len(req.prompt),
            weight_version=versions[0], weight_versions=tuple(versions),
            top_logprobs=list(req.tops) if req.top_logprobs else None)


def _engine_error(e: BaseException) -> EngineError:
    """What a request's future raises when the engine failed it: an EngineError (callers treat it as infra)."""
    if isinstance(e, EngineError):
        return e
    err = EngineError(f"{type(e).__name__}: {e}")
    err.__cause__ = e
    return err


def timed_wait(pred: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `pred` until true or timeout (shutdown; tests wait on futures or counted events instead)."""
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True
