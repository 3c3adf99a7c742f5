"""Weight sync to SGLang: `hf_exporter`, the exporter `SGLangEngine.update_weights(params, version)` uses
(beside `mpa_jax/export.py`, which exports training checkpoints)."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["hf_exporter"]


def hf_exporter(cfg: Any, tokenizer_dir: str | None = None, dtype: str | None = None) -> Callable[[Any, str], None]:
    """An `exporter` for `SGLangEngine`: writes a params pytree of `cfg` as an HF checkpoint directory
    (with the tokenizer files when `tokenizer_dir` is given) that SGLang can load from disk."""

    def export(params: Any, out_dir: str) -> None:
        from mpa_jax import models

        models.save_pretrained(models.Model(cfg, params), out_dir, tokenizer_dir=tokenizer_dir, dtype=dtype)

    return export
