"""Training metrics: JSONL and TensorBoard in the run directory, and the MFU estimate.

Only process 0 writes (every process computes the same replicated metrics).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

import jax

from mpa_jax.files import atomic_open

# Dense bf16 peak FLOP/s per device for the accelerators we target (vendor figures, no sparsity).
PEAK_BF16_FLOPS = {
    "h200": 989e12,
    "h100": 989e12,
    "a100": 312e12,
    "l4": 121e12,
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,
    "tpu v6e": 918e12,
}


def peak_flops_per_device(device: Any = None, override: float = 0.0) -> float | None:
    """Peak FLOP/s of one device: `override` when > 0, else the table by device kind, else None (CPU)."""
    if override and override > 0:
        return float(override)
    device = device or jax.devices()[0]
    kind = str(getattr(device, "device_kind", "")).lower()
    for name, flops in PEAK_BF16_FLOPS.items():
        if name in kind:
            return flops
    return None


def train_flops_per_token(n_params: int, n_layers: int, seq_len: int, attn_dim: int) -> float:
    """Forward+backward FLOPs per trained token: 6N for the matmuls + 6·L·T·d for causal attention scores.

    (12·L·T·d for full attention, halved for the causal mask, as in the PaLM appendix.)
    """
    return 6.0 * n_params + 6.0 * n_layers * seq_len * attn_dim


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak_per_device: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the device's peak is unknown."""
    if not peak_per_device or n_devices <= 0:
        return None
    return tokens_per_s * flops_per_token / (n_devices * peak_per_device)


class MetricsWriter:
    """Appends `{"step": s, **metrics}` lines to `<workdir>/metrics.jsonl` and scalars to `<workdir>/tb`.

    Both are on disk when `write` returns (the TensorBoard events are written and flushed synchronously,
    not by tensorboardX's background thread), so a killed run's TensorBoard has every step its JSONL has.

    `keep_through`: the step a resumed run continues from. Records after it, written by the run that
    was stopped after its last checkpoint, are dropped from the JSONL and hidden from TensorBoard (an
    events file starting with TensorBoard's purge marker at `keep_through + 1`), because this run
    writes those steps again. -1 starts both afresh; None (the default) appends to what is there.
    """

    def __init__(self, workdir: str, *, enabled: bool | None = None, filename: str = "metrics.jsonl",
                 keep_through: int | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, filename)
        self._tb: TensorBoardWriter | None = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            if keep_through is not None:
                truncate_metrics(self.path, keep_through)
            self._tb = TensorBoardWriter(os.path.join(workdir, "tb"),
                                         purge_step=None if keep_through is None else max(0, keep_through + 1))

    def write(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Record scalars for `step` (None and non-finite values are kept out of TensorBoard)."""
        if not self.enabled:
            return
        clean = {f"{prefix}{k}": _scalar(v) for k, v in metrics.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), **clean}, sort_keys=True) + "\n")
        assert self._tb is not None
        self._tb.scalars(int(step), {k: v for k, v in clean.items() if isinstance(v, float) and math.isfinite(v)})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class TensorBoardWriter:
    """Scalars to a TensorBoard events file in `logdir`, written and flushed at every call.

    tensorboardX's SummaryWriter queues events for a thread that flushes every two minutes; a run
    killed in between loses them (the JSONL kept them). This writes the records itself through
    tensorboardX's synchronous record writer. `purge_step`: TensorBoard hides earlier files' events at
    this step and after (what `SummaryWriter(purge_step=...)` writes).
    """

    def __init__(self, logdir: str, purge_step: int | None = None):
        from tensorboardX.event_file_writer import EventsWriter  # only the writing process needs it
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        os.makedirs(logdir, exist_ok=True)
        # nanoseconds in the suffix: files of runs started within one second still sort in start order
        self._w = EventsWriter(os.path.join(logdir, "events"), f".{time.time_ns()}")
        if purge_step is not None:
            self._w.write_event(Event(wall_time=time.time(), step=int(purge_step), session_log=SessionLog(status=SessionLog.START)))
        self._w.flush()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One event per scalar at `step`, flushed to the file before returning."""
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        now = time.time()
        for tag, v in values.items():
            self._w.write_event(Event(wall_time=now, step=int(step), summary=scalar(tag, float(v))))
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def truncate_metrics(path: str, keep_through: int) -> int:
    """Drop the records of a metrics JSONL after step `keep_through` (all of them for -1), atomically;
    returns how many were dropped."""
    if not os.path.exists(path):
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError):  # a line cut by a kill mid-write: the resumed run rewrites it
                dropped += 1
                continue
            if keep_through >= 0 and step <= keep_through:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        with atomic_open(path) as f:
            f.writelines(kept)
    return dropped


def scalar_leaves(tree: Any, prefix: str = "") -> dict[str, float]:
    """The finite numeric leaves of nested dicts as {"a/b/c": value} (e.g. an eval report for TensorBoard)."""
    out: dict[str, float] = {}
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out.update(scalar_leaves(v, f"{prefix}{k}/"))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool) and math.isfinite(float(tree)):
        out[prefix.rstrip("/")] = float(tree)
    return out


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (str, bool)):
        return v
    return float(v)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file (for tests, reports and resumed runs)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
