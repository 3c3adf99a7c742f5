"""The one atomic write (mpa_jax/files.py), and no hand-written tmp + replace of a file elsewhere."""
import json
import os
import re
from pathlib import Path

import pytest

from mpa_jax import files

ROOT = Path(__file__).resolve().parents[2]
# Directory swaps (a version or start directory built beside its target, then renamed) are not file writes.
DIRECTORY_RENAMES = {"mpa_jax/start.py", "harness/evolution.py", "mpa_jax/sft/world_refresh.py"}


def test_atomic_open_replaces_only_on_success(tmp_path):
    target = tmp_path / "d" / "out.bin"
    with files.atomic_open(str(target), "wb") as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError, match="half way"):
        with files.atomic_open(str(target), "wb") as f:
            f.write(b"torn")
            raise RuntimeError("half way")
    assert target.read_bytes() == b"new" and os.listdir(target.parent) == ["out.bin"]  # no temporary left
    files.write_json(str(tmp_path / "a.json"), {"b": 1, "a": [2]})
    assert json.loads((tmp_path / "a.json").read_text()) == {"a": [2], "b": 1}
    with pytest.raises(ValueError, match="mode"):
        with files.atomic_open(str(target), "a"):
            pass


def test_no_hand_written_atomic_write_outside_files_py():
    """`os.replace` / `os.rename` of a file is files.py's job."""
    hits = []
    for rel in ("mpa_jax", "envs", "harness"):
        for path in sorted((ROOT / rel).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name == "mpa_jax/files.py" or name in DIRECTORY_RENAMES:
                continue
            text = path.read_text(encoding="utf-8")
            hits += [f"{name}: {m.group(0)}" for m in re.finditer(r"os\.(?:replace|rename)\([^)]*\)", text)]
    assert not hits, hits
