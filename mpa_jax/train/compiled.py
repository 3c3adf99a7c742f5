"""The one compile cache: builders of jitted steps (SFT's train/eval steps, RL's update) keyed by everything
that shapes the program (model config, loss and optimizer settings as hashable tuples, mesh, rules).

Runs repeated in one process (resume, the loop's stages, an experiment's arms, tests) get the compiled
executables back instead of tracing and compiling identical functions again. The builders are pure and
every key part is hashable, so sharing them is safe. `clear()` drops them all; `info()` counts hits.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Programs kept per builder: a few settings alive at once (the loop's SFT and RL, an eval step) and no more,
# since each holds compiled executables.
MAXSIZE = 4
_BUILDERS: dict[str, Any] = {}


def compile_cache(fn: F) -> F:
    """Cache the step builder `fn` by its (hashable) arguments in the one compile cache."""
    cached = functools.lru_cache(maxsize=MAXSIZE)(fn)
    _BUILDERS[f"{fn.__module__}.{fn.__qualname__}"] = cached
    return cached  # type: ignore[return-value]


def info() -> dict[str, Any]:
    """Per builder (`module.name`): functools' CacheInfo (hits, misses, currsize)."""
    return {name: f.cache_info() for name, f in _BUILDERS.items()}


def clear() -> None:
    """Drop every cached program (e.g. before measuring compile time)."""
    for f in _BUILDERS.values():
        f.cache_clear()
