"""The embedded JAX engine, by job (no import circle: each module imports only those listed before it):

- `compiles`: counting XLA compilations per engine;
- `programs`: the jitted device programs (place, extend = chunked prefill, decode chunk with the one
  step body) over a slot state, pure functions cached per shape;
- `decoder`: `SlotDecoder`, the device state (slot rows, logits, weights) and the program calls;
- `prefix`: `PrefixIndex`, what each row holds and the best reuse for a prompt (the prefix cache);
- `scheduler`: `SlotLoop`, the host thread: admission with reuse, decode chunks, delivery;
- `facade`: `Engine`, the public engine (RolloutEngine + submit), weights, placement, stats.

`from mpa_jax.rollout.engine import Engine` (or the historical `mpa_jax.rollout.jax_engine`).
"""
from __future__ import annotations

from mpa_jax.rollout.engine.facade import Engine, check_vocab_limit, slot_support
from mpa_jax.rollout.engine.scheduler import GenerationFuture, SlotLoop, SlotRequest, timed_wait

__all__ = ["Engine", "check_vocab_limit", "slot_support", "GenerationFuture", "SlotLoop", "SlotRequest", "timed_wait"]
