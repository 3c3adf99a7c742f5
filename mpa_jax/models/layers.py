"""Building blocks shared by the model families: pure functions over arrays (no module state)."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str) -> jnp.dtype:
    """jnp dtype for a config dtype name."""
    try:
        return jnp.dtype(_DTYPES[name])
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (one of {', '.join(_DTYPES)})") from None


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis; statistics in float32, result in x.dtype (as transformers does)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x[..., in] @ kernel[in, out] as one 2-D matmul.

    Flattening the leading axes keeps the weight-gradient matmul a plain 2-D product; on 3-D
    activations XLA inserted transposes there that made the backward pass much slower on CPU.
    """
    lead = x.shape[:-1]
    y = jnp.dot(x.reshape(-1, x.shape[-1]), kernel.astype(x.dtype))
    return y.reshape(*lead, kernel.shape[-1])


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] (float32) for integer positions [B, T] (HF half-rotation layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by tables [B, T, head_dim]; result in x.dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c = cos[:, :, None, :].astype(x.dtype)
    s = sin[:, :, None, :].astype(x.dtype)
    return x * c + rotated * s


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention. q [B,T,N,H], k/v [B,S,K,H], mask bool broadcastable to [B,1,T,S].

    Goes through `jax.nn.dot_product_attention` with implementation=None so that XLA (CPU) or cuDNN
    (GPU) picks the fused kernel. Fully masked query rows (padding) give finite garbage, never NaN.
    """
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, block: int = 128
) -> jax.Array:
    """Self-attention whose `mask` is causal (a subset of it): skips the blocks above the diagonal.

    On CPU, query block i only meets keys [0, (i+1)*block): about (n+1)/2n of the work of the full
    T x T product for n blocks, which also shrinks the elementwise softmax passes that dominate
    there (-15% fwd+bwd step time at T=512). Elsewhere (GPU/TPU) one fused call is better.
    """
    t = q.shape[1]
    if jax.default_backend() != "cpu" or k.shape[1] != t or t % block or t < 2 * block:
        return attention(q, k, v, mask, scale)
    outs = []
    for i in range(t // block):
        end = (i + 1) * block
        outs.append(attention(q[:, i * block : end], k[:, :end], v[:, :end], mask[:, :, i * block : end, :end], scale))
    return jnp.concatenate(outs, axis=1)


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """down(silu(gate(x)) * up(x))."""
    return dense(jax.nn.silu(dense(x, gate)) * dense(x, up), down)


def default_positions(
    batch: int, length: int, segment_ids: jax.Array | None, attention_mask: jax.Array | None
) -> jax.Array:
    """Positions [B, T] when the caller gives none.

    Packed (segment_ids): restart at 0 at each segment start. Padded (attention_mask): count real
    tokens, so that left padding leaves the first real token at position 0 (as HF generate does).
    """
    if segment_ids is not None:
        idx = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        starts = jnp.concatenate(
            [jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
        )
        start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
        return idx - start_idx
    if attention_mask is not None:
        return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


def self_attention_mask(segment_ids: jax.Array | None, attention_mask: jax.Array | None, length: int) -> jax.Array:
    """Bool mask [B or 1, 1, T, T]: causal, within the same segment, keys that are real tokens."""
    causal = jnp.tril(jnp.ones((length, length), bool))[None, None]
    mask = causal
    if segment_ids is not None:
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        mask = mask & same
    if attention_mask is not None:
        mask = mask & attention_mask.astype(bool)[:, None, None, :]
    return mask


def remat_wrap(fn: Callable, policy: str) -> Callable:
    """Wrap a per-layer function in jax.checkpoint according to the config's remat policy."""
    if policy == "none":
        return fn
    if policy == "full":
        return jax.checkpoint(fn)
    if policy == "dots":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots)
    if policy == "dots_no_batch":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)
    raise ValueError(f"unknown remat policy {policy!r}")
