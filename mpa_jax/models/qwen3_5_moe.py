"""Qwen3.5-MoE hybrid decoder (family "qwen3_5_moe"): Qwen3.5 layers with the MoE block as MLP.

Everything but the MLP is shared with `qwen3_5` (which switches to `moe.block` for this family);
this module adds what only MoE models have: router logits and the load-balancing loss for training.

    hidden, router_logits = forward_with_aux(cfg, params, input_ids, ...)   # router_logits [L, B*T, E]
    aux = load_balancing_loss(cfg, router_logits, attention_mask)          # already times router_aux_loss_coef

HF tensors per layer: mlp.gate.weight [E, D] (router), mlp.experts.gate_up_proj [E, 2I, D] and
mlp.experts.down_proj [E, D, I] (fused), or mlp.experts.<e>.{gate,up,down}_proj.weight (per expert),
mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight [1, D].
"""
from __future__ import annotations

from typing import Any

import jax

from mpa_jax.models import moe
from mpa_jax.models.qwen3_5 import (  # noqa: F401 - the family functions registry.py requires
    check,
    config_from_hf,
    config_to_hf,
    decode,
    decode_slots,
    forward_with_aux,
    generation_config,
    hf_adapt_config,
    hf_ignored,
    hf_mapping,
    hidden_states,
    init_decode_state,
    init_params,
    layer_params,
    layer_types,
    param_logical_axes,
    scan_period,
    slot_cache_axes,
    unembedding,
)


def load_balancing_loss(cfg: Any, router_logits: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
    """router_aux_loss_coef * the Switch load-balancing loss of `forward_with_aux`'s router logits.

    `attention_mask` [B, T] (1 = real token) excludes padding, as transformers does.
    """
    mask = None if attention_mask is None else attention_mask.reshape(-1)
    loss = moe.load_balancing_loss(router_logits, cfg.num_experts, cfg.num_experts_per_tok, mask)
    return cfg.router_aux_loss_coef * loss
