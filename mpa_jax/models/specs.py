"""Parameter specs: each family declares one tree of (shape, logical axes, init kind) leaves, from
which its random init, its logical axes and its HF tensor names all derive."""
from __future__ import annotations

from typing import Any

import jax

from mpa_jax.models.config import ModelConfig


def is_spec(x: Any) -> bool:
    """A leaf of a spec tree: (shape, logical axes, init kind)."""
    return isinstance(x, tuple) and len(x) == 3 and isinstance(x[2], str)


def logical_axes(spec_tree: dict[str, Any]) -> dict[str, Any]:
    """The tree of logical axis-name tuples of a spec tree."""
    return jax.tree.map(lambda s: s[1], spec_tree, is_leaf=is_spec)


def decoder_tree(cfg: ModelConfig, layers_tree: dict[str, Any], final_norm: dict[str, Any]) -> dict[str, Any]:
    """The decoder around its layers, as HF names it: embedding, layers, final norm, untied lm_head."""
    d = cfg.hidden_size
    tree: dict[str, Any] = {
        "model": {
            "embed_tokens": {"weight": ((cfg.vocab_size, d), ("vocab", "embed"), "normal")},
            "layers": layers_tree,
            "norm": final_norm,
        }
    }
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = {"kernel": ((d, cfg.vocab_size), ("embed", "vocab"), "normal")}
    return tree
