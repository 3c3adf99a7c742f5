"""Sparse mixture-of-experts block of Qwen3.5-MoE: router, routed experts, gated shared expert.

Router: softmax over E experts in float32, top-k, the k weights renormalised to sum to 1. Routed
experts are SwiGLU MLPs computed as grouped matmuls (`jax.lax.ragged_dot_general`): the N*k
(token, expert) assignments are sorted by expert so each expert's tokens form one contiguous group.
The shared expert is a dense SwiGLU scaled by sigmoid(shared_expert_gate(x)).

Expert weights keep the Hugging Face layout so that checkpoints map 1:1: fused
`gate_up_proj` [E, 2I, D] + `down_proj` [E, D, I], or (per-expert checkpoints) stacked `gate_proj`,
`up_proj` [E, I, D] + `down_proj` [E, D, I]. The expert axis is the logical axis "experts".
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from mpa_jax.models import layers

Params = dict[str, Any]

# Contract x [N, D] with w [E, out, D] on D, grouped over E along x's rows.
_DN = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (2,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
)


def shapes(cfg: Any) -> Params:
    """(shape, logical axes, init) per parameter of one MoE block (HF names under `mlp.`)."""
    d, e = cfg.hidden_size, cfg.num_experts
    i, s = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    if cfg.expert_layout == "fused":
        experts = {"gate_up_proj": ((e, 2 * i, d), ("experts", "mlp", "embed"), "normal")}
    else:
        experts = {
            "gate_proj": ((e, i, d), ("experts", "mlp", "embed"), "normal"),
            "up_proj": ((e, i, d), ("experts", "mlp", "embed"), "normal"),
        }
    experts["down_proj"] = ((e, d, i), ("experts", "embed", "mlp"), "normal")
    return {
        "gate": {"weight": ((e, d), ("experts", "embed"), "normal")},
        "experts": experts,
        "shared_expert": {
            "gate_proj": {"kernel": ((d, s), ("embed", "mlp"), "normal")},
            "up_proj": {"kernel": ((d, s), ("embed", "mlp"), "normal")},
            "down_proj": {"kernel": ((s, d), ("mlp", "embed"), "normal")},
        },
        "shared_expert_gate": {"kernel": ((d, 1), ("embed", None), "normal")},
    }


def route(x: jax.Array, router_weight: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router logits [N, E] (float32), renormalised top-k weights [N, k] (x.dtype) and expert ids [N, k]."""
    logits = jnp.dot(x, router_weight.astype(x.dtype).T, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    top, idx = jax.lax.top_k(probs, top_k)
    top = top / jnp.sum(top, axis=-1, keepdims=True)
    return logits, top.astype(x.dtype), idx


def _grouped(x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot_general(
        x, w.astype(x.dtype), group_sizes, _DN, preferred_element_type=jnp.float32
    ).astype(x.dtype)


def routed_experts(experts: Params, x: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
    """Sum over each token's k experts of weight * SwiGLU_e(x): x [N, D] -> [N, D]."""
    n, k = idx.shape
    num_experts = experts["down_proj"].shape[0]
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # assignments grouped by expert
    token = order // k
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    xs = jnp.take(x, token, axis=0)
    if "gate_up_proj" in experts:
        gu = _grouped(xs, experts["gate_up_proj"], group_sizes)
        inter = gu.shape[-1] // 2
        gate, up = gu[:, :inter], gu[:, inter:]
    else:
        gate = _grouped(xs, experts["gate_proj"], group_sizes)
        up = _grouped(xs, experts["up_proj"], group_sizes)
    out = _grouped(jax.nn.silu(gate) * up, experts["down_proj"], group_sizes)
    out = out * jnp.take(weights.reshape(-1), order)[:, None]
    return jax.ops.segment_sum(out, token, num_segments=n).astype(x.dtype)


def block(cfg: Any, p: Params, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """MoE block on x [B, T, D]; returns (output [B, T, D], router logits [B*T, E] float32)."""
    b, t, d = x.shape
    flat = x.reshape(-1, d)
    logits, weights, idx = route(flat, p["gate"]["weight"], cfg.num_experts_per_tok)
    routed = routed_experts(p["experts"], flat, weights, idx)
    se = p["shared_expert"]
    shared = layers.swiglu(flat, se["gate_proj"]["kernel"], se["up_proj"]["kernel"], se["down_proj"]["kernel"])
    shared = jax.nn.sigmoid(layers.dense(flat, p["shared_expert_gate"]["kernel"])) * shared
    return (routed + shared).reshape(b, t, d), logits


def load_balancing_loss(
    router_logits: jax.Array, num_experts: int, top_k: int, mask: jax.Array | None = None
) -> jax.Array:
    """Switch-style auxiliary loss over layers: E * sum_e f_e * P_e (as transformers computes it).

    `router_logits` [L, N, E]; f_e = fraction of top-k assignments to e, P_e = mean router
    probability of e, both over all layers' (unmasked) tokens. `mask` [N] (1 = real token) or None.
    Multiply by `router_aux_loss_coef` and add to the training loss.
    """
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    _, idx = jax.lax.top_k(probs, top_k)
    counts = jax.nn.one_hot(idx, num_experts, dtype=jnp.float32).sum(axis=-2)  # [L, N, E]
    if mask is None:
        w = jnp.ones(router_logits.shape[:2], jnp.float32)
    else:
        w = jnp.broadcast_to(mask.astype(jnp.float32)[None], router_logits.shape[:2])
    rows = jnp.maximum(jnp.sum(w), 1.0)
    tokens_per_expert = jnp.einsum("ln,lne->e", w, counts) / rows
    prob_per_expert = jnp.einsum("ln,lne->e", w, probs) / rows
    return num_experts * jnp.sum(tokens_per_expert * prob_per_expert)
