"""Training metrics: JSONL and TensorBoard in the run directory, and the MFU estimate.

Only process 0 writes (every process computes the same replicated metrics).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import jax

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
    """Appends `{"step": s, **metrics}` lines to `<workdir>/metrics.jsonl` and scalars to `<workdir>/tb`."""

    def __init__(self, workdir: str, *, enabled: bool | None = None, filename: str = "metrics.jsonl"):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, filename)
        self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            from tensorboardX import SummaryWriter  # imported here: only the writing process needs it

            self._tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Record scalars for `step` (None and non-finite values are kept out of TensorBoard)."""
        if not self.enabled:
            return
        clean = {f"{prefix}{k}": _scalar(v) for k, v in metrics.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), **clean}, sort_keys=True) + "\n")
        for k, v in clean.items():
            if isinstance(v, float) and math.isfinite(v):
                self._tb.add_scalar(k, v, int(step))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (str, bool)):
        return v
    return float(v)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file (for tests, reports and resumed runs)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
