"""bench/learning_sweep.py: the grid varies one axis at a time around the base cell, each cell a
`mpa_jax.sft.micro` command; bad grid values are one clear error. (Dry run: the cells themselves are the
micro runs that tests/integration/test_learning.py and tests/integration/test_success_passk.py exercise for real.)"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/learning_sweep.py", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_dry_run_lists_one_micro_command_per_cell_around_the_base():
    res = _sweep("--dry-run", "--out", "W", "--templates", "contact_group.create,folder.create", "--steps", "40",
                 "--size", "1x64", "4x256", "--data", "16", "--context", "json/full")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == ["size", "size", "data", "context"]
    size_4x256 = lines[1].split()
    assert size_4x256[size_4x256.index("--layers") + 1] == "4" and size_4x256[size_4x256.index("--hidden") + 1] == "256"
    data16 = lines[2].split()
    assert data16[data16.index("--train") + 1] == "16" and data16[data16.index("--hidden") + 1] == "128"  # base size
    ctx = lines[3].split()
    assert ctx[ctx.index("--format") + 1] == "json" and ctx[ctx.index("--reasoning") + 1] == "full"
    assert all("mpa_jax.sft.micro" in ln and "--steps 40" in ln and "contact_group.create,folder.create" in ln for ln in lines)
    assert len({ln.split("--workdir ")[1].split()[0] for ln in lines}) == 4  # one work directory per cell


def test_bad_grid_values_are_one_clear_error():
    res = _sweep("--dry-run", "--size", "2by128")
    assert res.returncode != 0 and "model size '2by128'" in res.stderr
    res = _sweep("--dry-run", "--context", "yaml/none")
    assert res.returncode != 0 and "context 'yaml/none'" in res.stderr
