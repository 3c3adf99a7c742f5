"""Import path of the embedded engine used across the project: the code lives in `mpa_jax.rollout.engine`."""
from mpa_jax.rollout.engine import Engine, check_vocab_limit  # noqa: F401

__all__ = ["Engine", "check_vocab_limit"]
