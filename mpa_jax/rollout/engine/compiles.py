"""Counting XLA compilations: per engine (`CompileCounter` + `counting`) and the distinct programs built."""
from __future__ import annotations

import threading
from typing import Any

import jax

__all__ = ["CompileCounter", "counting"]


class CompileCounter:
    """XLA compilations made by the threads that run under `counting(counter)` (`n`), with their seconds."""

    def __init__(self) -> None:
        self.n = 0
        self.seconds = 0.0


_counting = threading.local()


def _on_jax_event(event: str, duration: float, **_: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        counter = getattr(_counting, "counter", None)
        if counter is not None:
            counter.n += 1
            counter.seconds += float(duration)


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


def persistent_cache(workdir: str) -> str | None:
    """Turn on JAX's persistent compilation cache under `<workdir>/xla_cache` (programs compiled by an
    earlier run of the same shapes load from disk instead of compiling: minutes per program at Qwen3-1.7B
    shape on a GPU). A cache directory already configured (`JAX_COMPILATION_CACHE_DIR` or an earlier
    call) is kept. Returns the directory in use."""
    import os

    current = jax.config.jax_compilation_cache_dir
    if current:
        return current
    path = os.path.join(os.path.abspath(workdir), "xla_cache")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    return path
