"""Gated DeltaNet token mixer of Qwen3.5 (the "linear_attention" layers): pure functions over arrays.

Per layer (HF names under `linear_attn.`): in_proj_qkv [D, 2*Hk*Dk + Hv*Dv] -> causal depthwise
conv1d (kernel K, no bias) + SiLU -> q, k [Hk, Dk] (L2-normalised), v [Hv, Dv]; in_proj_z [D, Hv*Dv]
is the output gate; in_proj_b -> beta = sigmoid(b); in_proj_a with A_log and dt_bias -> the log decay
g = -exp(A_log) * softplus(a + dt_bias); the gated delta rule (mpa_jax.kernels.gated_delta) mixes
tokens; a gated RMSNorm (weight * norm(o) * silu(z), weight not zero-centred) and out_proj [Hv*Dv, D].

Padding never enters a state: padded inputs are zeroed before the projections (as transformers does),
the conv does not read across packed-segment boundaries, and the delta rule skips padded tokens.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from mpa_jax.kernels import gated_delta as gd
from mpa_jax.models import layers

Params = dict[str, Any]


def dims(cfg: Any) -> dict[str, int]:
    """Head counts and widths of a DeltaNet layer."""
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return {"hk": hk, "hv": hv, "dk": dk, "dv": dv, "key_dim": hk * dk, "value_dim": hv * dv,
            "conv_dim": 2 * hk * dk + hv * dv, "kernel": cfg.linear_conv_kernel_dim}


def shapes(cfg: Any) -> Params:
    """(shape, logical axes, init) per parameter of one DeltaNet layer (HF layout; kernels [in, out])."""
    d = dims(cfg)
    h = cfg.hidden_size
    return {
        "in_proj_qkv": {"kernel": ((h, d["conv_dim"]), ("embed", "heads"), "normal")},
        "in_proj_z": {"kernel": ((h, d["value_dim"]), ("embed", "heads"), "normal")},
        "in_proj_b": {"kernel": ((h, d["hv"]), ("embed", "heads"), "normal")},
        "in_proj_a": {"kernel": ((h, d["hv"]), ("embed", "heads"), "normal")},
        # HF Conv1d weight [channels, 1, K] kept as is (depthwise: one filter per channel).
        "conv1d": {"weight": ((d["conv_dim"], 1, d["kernel"]), ("heads", None, None), "normal")},
        "dt_bias": ((d["hv"],), ("heads",), "ones"),
        "A_log": ((d["hv"],), ("heads",), "a_log"),
        "norm": {"weight": ((d["dv"],), ("head_dim",), "ones")},
        "out_proj": {"kernel": ((d["value_dim"], h), ("heads", "embed"), "normal")},
    }


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32 (the FLA/transformers convention)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """weight * rmsnorm(x) * silu(gate): statistics and gate in float32, result in x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    out = weight.astype(x.dtype) * normed
    return (out.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


def causal_conv(x: jax.Array, weight: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """SiLU(depthwise causal conv) of x [B, T, C] with weight [C, 1, K]; reads no earlier segment."""
    k = weight.shape[-1]
    t = x.shape[1]
    w = weight[:, 0, :].astype(x.dtype)  # [C, K]; tap K-1 multiplies the current token
    out = x * w[:, k - 1]
    for j in range(1, min(k, t + 1)):
        shifted = jnp.pad(x, ((0, 0), (j, 0), (0, 0)))[:, :t]
        if segment_ids is not None:
            seg_prev = jnp.pad(segment_ids, ((0, 0), (j, 0)), constant_values=-1)[:, :t]
            shifted = shifted * (seg_prev == segment_ids)[..., None].astype(x.dtype)
        out = out + shifted * w[:, k - 1 - j]
    return jax.nn.silu(out)


def conv_step(x: jax.Array, conv_state: jax.Array, weight: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Causal conv continuing from `conv_state` [B, K-1, C] (the previous K-1 inputs).

    Returns SiLU(conv) [B, T, C] and the new state: the K-1 inputs up to each row's last valid token
    (a row with none keeps its state: finished rows; right padding after a continued prompt's chunk
    is not part of the state).
    """
    k = weight.shape[-1]
    t = x.shape[1]
    buf = jnp.concatenate([conv_state.astype(x.dtype), x], axis=1)  # [B, K-1+T, C]
    w = weight[:, 0, :].astype(x.dtype)
    out = sum(buf[:, k - 1 - j : k - 1 - j + t] * w[:, k - 1 - j] for j in range(k))
    # End (in x's columns) of each row's last valid token: T for a left-padded or full row, 0 for none.
    end = jnp.max(jnp.where(valid, jnp.arange(1, t + 1), 0), axis=1)
    new_state = jax.vmap(lambda b, e: jax.lax.dynamic_slice_in_dim(b, e, k - 1, axis=0))(buf, end)
    return jax.nn.silu(out), new_state.astype(conv_state.dtype)


def _project(cfg: Any, p: Params, x: jax.Array):
    """Mixed qkv [B,T,C], z [B,T,Hv,Dv], beta and g [B,T,Hv] (float32) from normed hidden x."""
    d = dims(cfg)
    b, t, _ = x.shape
    mixed = layers.dense(x, p["in_proj_qkv"]["kernel"])
    z = layers.dense(x, p["in_proj_z"]["kernel"]).reshape(b, t, d["hv"], d["dv"])
    beta = jax.nn.sigmoid(layers.dense(x, p["in_proj_b"]["kernel"]).astype(jnp.float32))
    a = layers.dense(x, p["in_proj_a"]["kernel"]).astype(jnp.float32)
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(a + p["dt_bias"].astype(jnp.float32))
    return mixed, z, beta, g


def _split_heads(cfg: Any, mixed: jax.Array):
    d = dims(cfg)
    b, t, _ = mixed.shape
    q = mixed[..., : d["key_dim"]].reshape(b, t, d["hk"], d["dk"])
    k = mixed[..., d["key_dim"] : 2 * d["key_dim"]].reshape(b, t, d["hk"], d["dk"])
    v = mixed[..., 2 * d["key_dim"] :].reshape(b, t, d["hv"], d["dv"])
    return l2_normalize(q), l2_normalize(k), v


def _output(cfg: Any, p: Params, core: jax.Array, z: jax.Array, dtype: Any) -> jax.Array:
    b, t = core.shape[:2]
    o = gated_rms_norm(core.astype(dtype), z, p["norm"]["weight"], cfg.rms_norm_eps)
    return layers.dense(o.reshape(b, t, -1), p["out_proj"]["kernel"])


def forward(cfg: Any, p: Params, x: jax.Array, valid: jax.Array | None, segment_ids: jax.Array | None) -> jax.Array:
    """DeltaNet mixer over a whole sequence: x [B, T, D] (normed) -> [B, T, D].

    `valid` [B, T] bool (False = padding) or None; `segment_ids` [B, T] or None (packed sequences).
    """
    if valid is not None:
        x = x * valid[..., None].astype(x.dtype)
    mixed, z, beta, g = _project(cfg, p, x)
    mixed = causal_conv(mixed, p["conv1d"]["weight"], segment_ids)
    q, k, v = _split_heads(cfg, mixed)
    core, _ = gd.gated_delta(
        q, k, v, g, beta, mask=valid, segment_ids=segment_ids,
        chunk_size=cfg.delta_chunk_size, impl=cfg.delta_impl,
    )
    return _output(cfg, p, core, z, x.dtype)


def init_cache(cfg: Any, batch: int, dtype: Any) -> dict[str, jax.Array]:
    """Empty decode state of one layer: conv inputs [B, K-1, C] and float32 recurrent state [B, Hv, Dk, Dv]."""
    d = dims(cfg)
    return {
        "conv": jnp.zeros((batch, d["kernel"] - 1, d["conv_dim"]), dtype),
        "recurrent": jnp.zeros((batch, d["hv"], d["dk"], d["dv"]), jnp.float32),
    }


def decode(cfg: Any, p: Params, x: jax.Array, valid: jax.Array, cache: dict[str, jax.Array]):
    """DeltaNet mixer for T new tokens continuing from `cache`; returns (out [B, T, D], new cache).

    Padding inside a multi-token call is exact when it precedes the row's real tokens and the row's
    state is still empty (a left-padded prefill), and for one-token steps; it is read as zeros by
    the conv otherwise (as in the full forward).
    """
    x = x * valid[..., None].astype(x.dtype)
    mixed, z, beta, g = _project(cfg, p, x)
    mixed, conv = conv_step(mixed, cache["conv"], p["conv1d"]["weight"], valid)
    q, k, v = _split_heads(cfg, mixed)
    core, state = gd.gated_delta(
        q, k, v, g, beta, initial_state=cache["recurrent"], mask=valid,
        chunk_size=cfg.delta_chunk_size, impl=cfg.delta_impl,
    )
    return _output(cfg, p, core, z, x.dtype), {"conv": conv, "recurrent": state}
