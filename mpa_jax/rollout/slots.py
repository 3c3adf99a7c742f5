"""Import path of the slot helpers used by `mpa serve` and tests: the code lives in `mpa_jax.rollout.engine`."""
from mpa_jax.rollout.engine import GenerationFuture, SlotRequest, slot_support, timed_wait  # noqa: F401

__all__ = ["GenerationFuture", "SlotRequest", "slot_support", "timed_wait"]
