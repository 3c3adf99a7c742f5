"""Writing files so that a reader never sees half of one: the one atomic write (text, JSON, JSONL).

A temporary file beside the target (unique per writer), flushed and fsynced, then `os.replace`: after a
crash the path holds the old file or the new one, never a torn one. No jax: `envs/`, `harness/` and every
`mpa_jax` module may import it.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable


def write_text(path: str, text: str) -> str:
    """Write `text` to `path` atomically (creates the parent directory); returns `path`."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str, obj: Any, *, indent: int | None = 2, sort_keys: bool = True, default: Any = None) -> str:
    """`obj` as JSON to `path`, atomically."""
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default))


def write_jsonl(path: str, records: Iterable[Any]) -> str:
    """Records with `to_json()` (the contract's Task, Trajectory, ...) one per line to `path`, atomically."""
    return write_text(path, "".join(r.to_json() + "\n" for r in records))
