"""Writing files so that a reader never sees half of one: the one atomic JSON (and text) write.

No jax: `envs/`, `harness/` and every `mpa_jax` module may import it.
"""
from __future__ import annotations

import json
import os
from typing import Any


def write_text(path: str, text: str) -> None:
    """Write `text` to `path` atomically: a sibling temporary file, then `os.replace` (a crash leaves the old
    file or the new one, never a torn one). Creates the parent directory."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"  # per process: two writers never share a temporary file
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, obj: Any, *, indent: int | None = 2, sort_keys: bool = True, default: Any = None) -> None:
    """`obj` as JSON to `path`, atomically (`write_text`)."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default))
