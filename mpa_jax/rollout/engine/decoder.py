"""`SlotDecoder`: the device side of the engine: the slot state, the weights, and calls of the programs.

`slots` rows (split over `replicas` weight copies: slot s lives on replica s % R as its slot s // R),
each holding up to `max_len` tokens in columns [0, n) plus `chunk_tokens` columns of slack for a prefill
chunk's padding. The host (`scheduler.SlotLoop`) decides what goes where; this class only packs host
arrays into the programs' fixed shapes:

- `admit(rows)`: per row a placement (a prefix copied from another row of the same replica, cut, emptied)
  and up to `chunk_tokens` new tokens, 2 or `max_prefill` rows per replica a call;
- `decode(...)`: one chunk of up to `long_chunk` steps over the live rows of each replica, gathered into
  one of three widths (1, a quarter of the rows, all of them: idle rows are not computed), attending over
  `span` columns (a power of two from `min_span`, 256): programs per sampling path = 3 widths x the spans
  the rows reach, whatever the mix of prompt lengths below them.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout.engine import programs

__all__ = ["SlotDecoder", "SUPPORTED_FAMILIES", "bucket"]

SUPPORTED_FAMILIES = tuple(models.registry.FAMILIES)  # every family implements `decode_slots`


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


class SlotDecoder:
    """Device state and program calls for `slots` rows of up to `max_len` tokens (module docstring).

    `replica_mesh`: a 1-D ("replica",) mesh over R devices, each holding a copy of the weights and
    S / R slots; `mesh`: the engine's sharding mesh (weights sharded by rules; the slot state
    replicated over it); neither: one device.
    """

    def __init__(self, cfg: models.ModelConfig, *, slots: int, max_len: int, chunk: int = 8, vocab_limit: int | None = None,
                 cache_dtype: str | None = None, replica_mesh: Any = None, mesh: Any = None, max_prefill: int = 16,
                 long_chunk: int | None = None, chunk_tokens: int = 256, min_span: int = 256) -> None:
        if cfg.family not in SUPPORTED_FAMILIES:
            raise ValueError(f"SlotDecoder: model family {cfg.family!r} has no slot decoding")
        if chunk < 1 or max_len < 2:
            raise ValueError(f"SlotDecoder: chunk must be >= 1 and max_len >= 2, got {chunk}, {max_len}")
        if chunk_tokens < 1:
            raise ValueError(f"SlotDecoder: chunk_tokens (prefill chunk) must be >= 1, got {chunk_tokens}")
        self.cfg = cfg
        self.replicas = int(replica_mesh.devices.size) if replica_mesh is not None else 1
        self.per_replica = bucket(-(-max(int(slots), 1) // self.replicas))
        self.slots = self.per_replica * self.replicas
        self.chunk = int(chunk)
        self.long_chunk = max(int(long_chunk) if long_chunk is not None else 4 * self.chunk, self.chunk)
        self.max_len = int(max_len)
        self.chunk_tokens = int(chunk_tokens)
        self.cols = self.max_len + self.chunk_tokens  # a last prefill chunk's padding never wraps
        self.min_span = int(min_span)
        self.max_prefill = min(bucket(max_prefill), self.per_replica)  # rows per replica of a full admission call
        self.few_prefill = min(2, self.max_prefill)  # rows per replica of a short one
        self.small_chunk = min(64, self.chunk_tokens)  # new tokens per row of a short admission (a turn's continuation)
        # Decode chunk widths (rows computed per replica): a lone row, a quarter of the rows, all of them.
        self.widths = sorted({1, max(self.per_replica // 4, 1), self.per_replica})
        self.vocab_limit = int(vocab_limit) if vocab_limit is not None else int(cfg.vocab_size)
        self.cache_dtype = cache_dtype
        from jax.sharding import NamedSharding, PartitionSpec

        self._shard_map_mesh = replica_mesh
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
        state = jax.eval_shape(lambda: models.init_slot_state(cfg, self.per_replica, self.cols, cache_dtype))
        self.state = jax.device_put(jax.tree.map(lambda s: jnp.zeros((self.replicas,) + s.shape, s.dtype), state), self._rows)
        self.logits = jax.device_put(jnp.zeros((self.replicas, self.per_replica, cfg.vocab_size), jnp.float32), self._rows)
        self.prefills = 0  # admission program calls
        self.columns = 0  # token columns the admission calls computed (padding included)
        self.steps = 0  # decode chunk calls
        self.programs: set[tuple] = set()  # distinct program shapes called (each one compilation)

    # ---- weights and shapes ---------------------------------------------------------------------------

    def set_weights(self, params: Any, version: str) -> None:
        """Prepare `params` (placed as the programs expect) for decoding; labels later tokens `version`."""
        self._dparams = programs.decode_params_program(self.cfg)(params)
        self.programs.add(("decode_params",))
        self.version = str(version)

    @property
    def ready(self) -> bool:
        return self._dparams is not None

    def fits(self, prompt_len: int, max_new: int) -> bool:
        """Whether a request fits one slot."""
        return int(prompt_len) + int(max_new) <= self.max_len

    def span(self, needed: int) -> int:
        """Columns a chunk attends over when its rows hold at most `needed` (its steps included): a power of
        two from `min_span` (attention and the window copy cost what the rows hold), capped at the columns."""
        return min(bucket(needed, self.min_span), self.cols)

    # ---- programs -------------------------------------------------------------------------------------

    def _put(self, a: np.ndarray) -> jax.Array:
        return jax.device_put(np.ascontiguousarray(a), self._rows)

    def admit(self, rows: list[tuple[int, int, int, bool, list[int], int]]) -> None:
        """One admission call: per row (src slot, dst slot, tokens kept, copy its logits, new tokens, tokens
        held before them): dst becomes src's first `keep` tokens (src == dst with keep = what it holds: left
        as it is), then gets up to `chunk_tokens` new tokens (its logits: those after the last one). At most
        `max_prefill` rows per replica (the caller splits); src and dst on the same replica. All placements
        of a call read the state before it."""
        r = self.replicas
        # The call's shape fits what is waiting (a lone turn continuation is one short row, not a full
        # block of padding): rows per replica 2 or `max_prefill`, new tokens per row `small_chunk` or
        # `chunk_tokens`, columns the span its rows reach. Programs: 2 x 2 x the spans used. Never one row:
        # XLA:CPU compiles a one-row placement into a copy of the whole slot state (7x the time of two rows).
        most = max(np.bincount([row[1] % r for row in rows], minlength=r))
        nb = self.few_prefill if most <= self.few_prefill else self.max_prefill
        longest = max(len(row[4]) for row in rows)
        c = self.small_chunk if longest <= self.small_chunk else self.chunk_tokens
        span = self.span(max(row[5] + c for row in rows))
        ids = np.zeros((r, nb, c), np.int32)
        ints = np.zeros((r, nb, 6), np.int32)
        ints[:, :, 1] = self.per_replica  # filler: dropped
        fill = [0] * r
        for src, dst, keep, with_logits, toks, start in rows:
            k = dst % r
            if src % r != k:
                raise ValueError(f"SlotDecoder.admit: slots {src} and {dst} are on different replicas")
            if len(toks) > c or start + len(toks) > self.max_len or keep > span:
                raise ValueError(f"SlotDecoder.admit: {len(toks)} tokens after {start} (keeping {keep}) do not fit a chunk of {c}"
                                 f" / slot of {self.max_len}")
            if fill[k] == nb:
                raise ValueError(f"SlotDecoder.admit: more than {nb} rows on one replica in one call")
            j = fill[k]
            fill[k] += 1
            ids[k, j, : len(toks)] = toks
            ints[k, j] = (src // r, dst // r, keep, int(with_logits), len(toks), start)
        self.programs.add(("admit", nb, c, span))
        program = programs.admit_program(self.cfg, self.cache_dtype, span, self._shard_map_mesh, self._out)
        self.state, self.logits = program(self._dparams, self.state, self.logits, self._put(ids), self._put(ints))
        self.prefills += 1
        self.columns += c * nb * r

    def decode(self, pos: np.ndarray, t: np.ndarray, live: np.ndarray, seeds: np.ndarray, temperature: np.ndarray,
               top_k: np.ndarray, top_p: np.ndarray, max_new: np.ndarray, stops: np.ndarray, *, greedy: bool,
               filtered: bool, n_top: int, steps: int | None = None, span: int | None = None) -> tuple[np.ndarray, ...]:
        """One chunk of `steps` (default `chunk`, at most `long_chunk`) over every slot, attending over
        the first `span` columns (default all). Per-slot host arrays [S, ...] in slot order; returns numpy
        in slot order (tokens [S, long_chunk], log-probs, emitted, live [S], stopped [S], top ids, top
        log-probs)."""
        r, per = self.replicas, self.per_replica
        # Rows computed per replica: the live ones, gathered into the smallest of `widths` that holds them
        # (idle rows cost no compute; a chunk's programs: one per width and span).
        live_at = live.reshape(per, r).T  # [R, per]: slot s is replica s % R's row s // R
        most = int(live_at.sum(axis=1).max())
        width = next(w for w in self.widths if w >= most)
        sel = np.zeros((r, width), np.int32)
        for k in range(r):
            rows = np.flatnonzero(live_at[k])
            # filler: distinct idle rows (not live: computed but left as they were)
            sel[k] = np.concatenate([rows, np.flatnonzero(~live_at[k])[: width - len(rows)]]) if width < per else np.arange(per)

        def to_dev(a: np.ndarray) -> np.ndarray:  # [S, ...] slot order -> [R, width, ...]
            per_rep = np.swapaxes(a.reshape((per, r) + a.shape[1:]), 0, 1)
            return np.take_along_axis(per_rep, sel.reshape(sel.shape + (1,) * (a.ndim - 1)), axis=1)

        def to_host(a: np.ndarray) -> np.ndarray:  # [R, width, ...] -> [S, ...] slot order, zero-filled
            full = np.zeros((r, per) + a.shape[2:], a.dtype)
            for k in range(r):
                full[k, sel[k]] = a[k]
            return np.swapaxes(full, 0, 1).reshape((self.slots,) + a.shape[2:])

        steps = self.chunk if steps is None else int(steps)
        span = self.cols if span is None else int(span)
        if not 1 <= steps <= self.long_chunk or span > self.cols or (live.any() and int(pos[live].max()) + steps > span):
            raise ValueError(f"SlotDecoder.decode: {steps} steps over a span of {span} do not fit the rows")
        self.programs.add(("chunk", self.long_chunk, greedy, filtered, n_top, width, span))
        program = programs.chunk_program(self.cfg, self.vocab_limit, self.long_chunk, greedy, filtered, n_top, width, span,
                                         self._shard_map_mesh, self._out)
        # Two host->device transfers per chunk (ints, floats), not one per knob: each is a round trip per replica.
        n_run = np.full((self.slots,), steps, np.int32)
        ints = np.concatenate([np.stack([pos, t, live, seeds.view(np.int32), top_k, max_new, n_run], axis=1).astype(np.int32),
                               stops.astype(np.int32)], axis=1)
        floats = np.stack([temperature, top_p], axis=1).astype(np.float32)
        self.state, self.logits, *outs = program(self._dparams, self.state, self.logits, self._put(sel),
                                                 self._put(to_dev(ints)), self._put(to_dev(floats)))
        self.steps += 1
        return tuple(to_host(np.asarray(x)) for x in jax.device_get(outs))
