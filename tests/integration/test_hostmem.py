"""`mpa` re-executes itself once with glibc's huge-page tunable (mpa_jax/hostmem.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from mpa_jax import hostmem


def test_huge_pages_env():
    env = hostmem.huge_pages_env({"PATH": "/bin"}, mode="madvise")
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env["PATH"] == "/bin"
    # Other tunables are kept; a second pass (the re-executed process) changes nothing.
    assert hostmem.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, mode="madvise")["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    assert hostmem.huge_pages_env(env, mode="madvise") is None
    assert hostmem.huge_pages_env({"MPA_HUGE_PAGES": "0"}, mode="madvise") is None
    assert hostmem.huge_pages_env({}, mode="never") is None and hostmem.huge_pages_env({}, mode="always") is None
    assert hostmem.thp_mode() in ("always", "madvise", "never", "")


def test_reexec_once_with_the_tunable(tmp_path):
    """A fresh interpreter re-executes into a probe that prints the environment it got."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os; print(os.environ.get('GLIBC_TUNABLES'), os.environ.get('MPA_HUGE_PAGES_REEXEC'))\n")
    code = (
        "import sys; from mpa_jax import hostmem; "
        f"hostmem.reexec_with_huge_pages([sys.executable, {str(probe)!r}]); print('not re-executed')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MPA_HUGE_PAGES_REEXEC")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    if hostmem.thp_mode() == "madvise":
        assert out.split() == ["glibc.malloc.hugetlb=1", "1"]
    else:  # THP "always" or "never": nothing to do
        assert out.strip() == "not re-executed"
