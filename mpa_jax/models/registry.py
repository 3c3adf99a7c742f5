"""Model families: name -> implementing module (imported lazily), and HF `model_type` -> family.

The public functions in `mpa_jax.models` dispatch on `cfg.family` to a *family module*. A family module
is a plain Python module that defines the functions below (pure functions over plain nested-dict
pytrees; nothing stateful). `cfg` is always a `mpa_jax.models.ModelConfig`.

Required:

    init_params(cfg, rng) -> params
        Random parameters (param_dtype), unsharded. The caller wraps it in `jax.jit(out_shardings=...)`
        so it must be traceable and must not depend on concrete values of `rng`.
    param_logical_axes(cfg) -> tree
        Same tree structure as `init_params`; each leaf a tuple of logical axis names (one per array dim;
        names from the vocabulary: batch, length, embed, mlp, heads, kv_heads, head_dim, vocab, experts,
        norm, layers, ...; a name with no sharding rule is replicated).
    hidden_states(cfg, params, input_ids, positions, segment_ids, attention_mask) -> [B, T, D]
        Final hidden states after the final norm, in cfg.compute_dtype. `positions` [B, T] int32 or None
        (None -> arange(T), or cumsum(attention_mask)-1 when a mask is given; with segment_ids, the
        position restarts at 0 at each new segment). `segment_ids` [B, T] int32 or None (tokens attend
        only within the same segment id; 0 marks padding). `attention_mask` [B, T] (1 = real token,
        0 = padding; left or right padding both work).
    unembedding(cfg, params) -> [D, V]
        The output projection (tied models: the embedding transposed).
    init_decode_state(cfg, batch, max_len, dtype) -> state pytree
    decode(cfg, params, input_ids, positions, state, attention_mask) -> (logits [B, T, V] float32, state)
        Incremental decoding; semantics documented in `mpa_jax.models.__init__` (shared by all families).
    decode_slots(cfg, params, tokens, positions, live, state, column) -> (logits [B, V] float32, state)
        One token per row of a *slot state* (the serving/rollout engine's rows, each its own request at
        its own position): ring caches with one write column shared by every row, per-row recurrent
        states; semantics in `mpa_jax.models.__init__`. The state is `init_decode_state`'s without
        `index` (`models.init_slot_state`).
    slot_cache_axes(cfg) -> tree
        Same structure as the state's `layers`: per cache leaf its ring (sequence) axis, or None for a
        per-row state without one (DeltaNet's conv and recurrent state). `models.prefill_slots` places
        a prefilled prompt into slot rows with it, generically.
    hf_mapping(cfg) -> list[hf_io.TensorMap]
        How parameters map to Hugging Face safetensors names: each `TensorMap(path, hf_names, transpose)`
        says that the param leaf at `path` (tuple of dict keys) is the HF tensor `hf_names[0]` (transposed
        when `transpose`), or, with several names, those tensors stacked along a new leading axis (e.g.
        per-expert weights). Loading and saving are generic over this list: every listed HF tensor must be
        present with the right shape; unlisted tensors are an error unless `hf_ignored(cfg, name)` is true.

Optional hooks (generic defaults in `config.py` / `hf_io.py` are used when absent):

    config_from_hf(hf: dict) -> dict          # ModelConfig field values from a config.json dict
    config_to_hf(cfg) -> dict                 # config.json dict
    hf_ignored(cfg, name: str) -> bool        # HF tensors that are allowed but not loaded (default: none,
                                              #   plus lm_head.weight when embeddings are tied)
    generation_config(cfg) -> dict            # generation_config.json contents
    hf_adapt_config(cfg, names: list[str]) -> cfg  # adjust the config to a checkpoint's tensor names
                                              #   (e.g. MoE expert layout) before loading
"""
from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES: dict[str, str] = {
    "qwen3": "mpa_jax.models.qwen3",
    "qwen3_5": "mpa_jax.models.qwen3_5",
    "qwen3_5_moe": "mpa_jax.models.qwen3_5_moe",
}

MODEL_TYPES: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}

REQUIRED = (
    "init_params",
    "param_logical_axes",
    "hidden_states",
    "unembedding",
    "init_decode_state",
    "decode",
    "decode_slots",
    "slot_cache_axes",
    "hf_mapping",
)


def family_from_model_type(model_type: str) -> str:
    """Family name for a Hugging Face `model_type`; raises ValueError naming unsupported types."""
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in config.json (supported: {', '.join(sorted(MODEL_TYPES))})"
        )
    return MODEL_TYPES[model_type]


def family_module(family: str) -> ModuleType:
    """Import and return the module implementing `family`; raises ValueError for unknown families."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (known: {', '.join(sorted(FAMILIES))})")
    module = importlib.import_module(FAMILIES[family])
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise ValueError(f"model family {family!r} ({FAMILIES[family]}) lacks {', '.join(missing)}")
    return module
