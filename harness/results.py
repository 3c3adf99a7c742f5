"""The size cap on a tool provider's answer (`harness.max_result_chars`).

A provider (an MCP server above all) may answer megabytes (`git_diff_staged` of a 6 MB file), which would
go whole into the planner's context. `cap_result` keeps the first `max_chars` characters of the result's
text, ends it with a marker that gives the full size, and records the full result's sha256 in the
Feedback's `message` (not shown to the planner for a successful call, kept by the trace and the
Trajectory's steps) and its size in `cost["result_chars"]`, so a trace can still tell two results apart.
No jax.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from mpa_jax.envs.contract import Feedback


def result_text(result: Any) -> str | None:
    """The text a result is measured by: a string itself, anything else as JSON (None for no result)."""
    if result is None:
        return None
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)


def cut_marker(shown: int, total: int) -> str:
    """The line that ends a cut result: how much of how much is shown."""
    return f"\n[result cut: the first {shown:,} of {total:,} characters are shown]"


def cap_result(fb: Feedback, max_chars: int) -> Feedback:
    """`fb` with its result (and, for an error, its message) cut to `max_chars` characters; `max_chars`
    <= 0 leaves it whole. A cut result becomes a string: its text up to the cap plus `cut_marker`."""
    if max_chars <= 0 or "result_chars" in fb.cost:  # no cap, or cut already (by the provider itself)
        return fb
    changes: dict[str, Any] = {}
    text = result_text(fb.result)
    if text is not None and len(text) > max_chars:
        digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
        changes["result"] = text[:max_chars] + cut_marker(max_chars, len(text))
        note = f"result cut to {max_chars:,} of {len(text):,} characters; sha256 of the full result: {digest}"
        changes["message"] = note if fb.ok or not fb.message else f"{fb.message} ({note})"
        changes["cost"] = {**fb.cost, "result_chars": float(len(text))}
    message = changes.get("message", fb.message)
    if not fb.ok and len(message) > max_chars:  # an error's message is shown to the planner: cut it too
        changes["message"] = message[:max_chars] + f" [message cut: {max_chars:,} of {len(message):,} characters shown]"
    return dataclasses.replace(fb, **changes) if changes else fb
