"""The default rules from logical axis names to mesh axes, written once (no jax: configs import it).

`configs/tiny.py` sets `c.sharding_rules` from it (recipes edit their copy); `mpa_jax.sharding` uses it when
a caller gives no rules (tests, `models.from_pretrained` without a config).
"""
from __future__ import annotations

from typing import Any

MESH_AXES = ("data", "fsdp", "tensor", "expert")
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("vocab", "tensor"),
    ("experts", "expert"),
)
