"""The RL loop's two errors: one that stops a run before it starts, one that stops it while it runs."""
from __future__ import annotations


class RLSetupError(ValueError):
    """The RL run cannot start: a config key, the init checkpoint or the task filter is wrong (named)."""


class RLDiverged(RuntimeError):
    """`rl.max_bad_updates` updates in a row had a non-finite loss or gradient norm; the last good
    checkpoint is kept."""
