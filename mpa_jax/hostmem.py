"""Host memory allocator settings for XLA:CPU (and anything else in the process).

XLA:CPU allocates each execution's buffers (for a training step, one large block of temporaries)
with glibc `posix_memalign` and frees them when the step ends. With glibc's defaults a block that
large is a fresh `mmap` every time, so every step faults its temporaries in again page by page: at
the `bench/forward.py` shape (Qwen3 256 wide, 8 x 512 tokens) ~177,000 minor page faults per step,
~16% of the step's time on one core. `keep_freed_memory()` makes freed memory stay in the process
heap for reuse: no `mmap` for large blocks, one arena (XLA's worker threads would otherwise get
their own heaps, which glibc shrinks back eagerly) and no trimming of the heap top. The cost is
that the process keeps its peak heap size instead of returning memory to the OS.

Nothing here imports jax; `mpa` calls `keep_freed_memory()` at start-up (set `MPA_KEEP_FREED_MEMORY=0`
to leave glibc's defaults). Only glibc (Linux) is tuned; elsewhere it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt parameters from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Tune glibc malloc to reuse freed memory (see the module docstring). True when applied."""
    if os.environ.get("MPA_KEEP_FREED_MEMORY", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    # All three are needed (measured): without one arena or without the trim threshold the faults stay.
    settings = ((_M_MMAP_MAX, 0), (_M_ARENA_MAX, 1), (_M_TRIM_THRESHOLD, 1 << 30))
    return all(mallopt(param, value) == 1 for param, value in settings)
