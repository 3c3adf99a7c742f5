"""Writing files so that a reader never sees half of one: the one atomic write (text, JSON, JSONL, or a
stream through `atomic_open`).

A temporary file beside the target (unique per writer), flushed and fsynced, then `os.replace`: after a
crash the path holds the old file or the new one, never a torn one. No jax: `envs/`, `harness/` and every
`mpa_jax` module may import it.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterable, Iterator


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO[Any]]:
    """A file to stream into (`mode` "w" text, "wb" bytes) that becomes `path` only when the block ends without
    an error (fsynced, then `os.replace`); on an error the temporary file is removed and `path` is untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> str:
    """Write `text` to `path` atomically (creates the parent directory); returns `path`."""
    with atomic_open(path) as f:
        f.write(text)
    return path


def write_json(path: str, obj: Any, *, indent: int | None = 2, sort_keys: bool = True, default: Any = None) -> str:
    """`obj` as JSON to `path`, atomically."""
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default))


def write_jsonl(path: str, records: Iterable[Any]) -> str:
    """Records with `to_json()` (the contract's Task, Trajectory, ...) one per line to `path`, atomically."""
    return write_text(path, "".join(r.to_json() + "\n" for r in records))
