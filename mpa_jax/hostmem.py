"""Transparent huge pages for glibc malloc's large blocks (CPU hosts).

XLA:CPU allocates each execution's temporaries (for a training step, hundreds of MB) with glibc
malloc, which maps blocks that large freshly on every step, so the kernel faults them in 4 KiB page
by page: ~177,000 page faults per step at the `bench/forward.py` shape. With glibc's
`glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) malloc asks for transparent huge pages on those
blocks (2 MiB pages; it matters where THP is in `madvise` mode, the common default). Measured on the
2-core CPU host (docs/perf.md): the tiny config's SFT step at 8 x 2048 1,720 -> 1,506 ms; decode
unchanged.

The tunable is read when the process starts, so the `mpa` console script re-executes itself once
with it set (`python -m mpa_jax.cli` does not). `MPA_HUGE_PAGES=0` turns this off. Nothing here
imports jax.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

TUNABLE = "glibc.malloc.hugetlb=1"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
_MARK = "MPA_HUGE_PAGES_REEXEC"


def thp_mode() -> str:
    """The kernel's THP mode ("always", "madvise" or "never"); "" when unknown (not Linux)."""
    try:
        with open(_THP) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else ""


def huge_pages_env(env: dict[str, str] | None = None, mode: str | None = None) -> dict[str, str] | None:
    """`env` (default: this process's) with the tunable added, or None when there is nothing to do
    (already set, turned off with MPA_HUGE_PAGES=0, or THP not in madvise mode). `mode` is the THP
    mode to decide for (default: this kernel's, `thp_mode()`)."""
    env = dict(os.environ if env is None else env)
    tunables = env.get("GLIBC_TUNABLES", "")
    if (
        env.get("MPA_HUGE_PAGES", "1") == "0"
        or env.get(_MARK)  # already re-executed (whatever glibc did with the variable)
        or "glibc.malloc.hugetlb" in tunables
        or (thp_mode() if mode is None else mode) != "madvise"
    ):
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    env[_MARK] = "1"
    return env


def reexec_with_huge_pages(argv: Sequence[str]) -> None:
    """Replace this process with `argv` (argv[0] = the program) run with the tunable set; returns
    without doing anything when `huge_pages_env` says there is nothing to do."""
    env = huge_pages_env()
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], list(argv), env)
