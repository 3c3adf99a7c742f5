"""Building blocks shared by the model families: pure functions over arrays (no module state)."""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str) -> jnp.dtype:
    """jnp dtype for a config dtype name."""
    try:
        return jnp.dtype(_DTYPES[name])
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (one of {', '.join(_DTYPES)})") from None


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis: statistics and the scaling in float32, result in x.dtype.

    transformers rounds the normalised value to x.dtype before scaling: identical in float32; in
    bfloat16 one rounding instead of two (measured slightly closer to the float32 model), and the
    weight gradient's sum over tokens stays in float32 (in bfloat16 XLA:CPU split that sum into
    slow reduce-windows).
    """
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * normed).astype(x.dtype)


def dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x[..., in] @ kernel[in, out] as one 2-D matmul, result in x.dtype.

    Flattening the leading axes keeps the weight-gradient matmul a plain 2-D product; on 3-D
    activations XLA inserted transposes there that made the backward pass much slower on CPU.
    """
    lead = x.shape[:-1]
    x2, w = x.reshape(-1, x.shape[-1]), kernel.astype(x.dtype)
    y = _cpu_matmul_f32(x2, w).astype(x.dtype) if _cpu_low_precision(x) else jnp.dot(x2, w)
    return y.reshape(*lead, kernel.shape[-1])


def matmul_f32(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [M, K] @ w [K, N] accumulated in and returned as float32.

    On CPU with 16-bit operands this goes through `_cpu_matmul_f32`, whose backward pass runs in
    x's dtype (the cotangent rounded to it, as mixed-precision training does).
    """
    if _cpu_low_precision(x):
        return _cpu_matmul_f32(x, w)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _cpu_low_precision(x: jax.Array) -> bool:
    return x.dtype.itemsize < 4 and jax.default_backend() == "cpu"


def row_major(a: jax.Array) -> jax.Array:
    """`a` laid out row-major in memory: a transposed operand becomes a real transposed copy, not
    a view with a transposed layout."""
    return with_layout_constraint(a, Layout(major_to_minor=tuple(range(a.ndim))))


@jax.custom_vjp
def _cpu_matmul_f32(x: jax.Array, w: jax.Array) -> jax.Array:
    """XLA:CPU runs a bfloat16 dot on the CPU's bf16 matrix units (AMX) only in one form: the plain
    [M, K] x [K, N] product over row-major operands, accumulated into float32. Anything else (a
    bfloat16 result, a transposed operand) is upcast to a float32 dot, 4-6x slower on the 2-core
    AMX host (docs/perf.md). Autodiff would give such forms in the backward pass (float32
    cotangents, transposed operands), so the backward is written out with materialised transposes.
    """
    return jnp.dot(row_major(x), row_major(w), preferred_element_type=jnp.float32)


def _cpu_matmul_f32_fwd(x, w):
    return _cpu_matmul_f32(x, w), (x, w)


def _cpu_matmul_f32_bwd(res, g):
    x, w = res
    g = g.astype(x.dtype)
    dx = jnp.dot(g, row_major(w.T), preferred_element_type=jnp.float32).astype(x.dtype)
    dw = jnp.dot(row_major(x.T), g, preferred_element_type=jnp.float32).astype(w.dtype)
    return dx, dw


_cpu_matmul_f32.defvjp(_cpu_matmul_f32_fwd, _cpu_matmul_f32_bwd)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] (float32) for integer positions [B, T] (HF half-rotation layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by tables [B, T, head_dim]; result in x.dtype."""
    return _rope(x, cos, sin)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rope_plain(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    c = cos[:, :, None, :].astype(x.dtype)
    s = sin[:, :, None, :].astype(x.dtype)
    return x * c + _rotate_half(x) * s


# The rotation is orthogonal, so its input gradient is the rotation by -angle: one elementwise pass.
# Plain autodiff of the concatenate gave pads + adds over [B, T, heads, head_dim] (slow on CPU).
_rope = jax.custom_vjp(_rope_plain)


def _rope_fwd(x, cos, sin):
    return _rope_plain(x, cos, sin), (x, cos, sin)


def _rope_bwd(res, g):
    x, cos, sin = res
    # y = x*c + R(x)*s with R^T = -R:  dx = g*c - R(g*s).
    c = cos[:, :, None, :].astype(g.dtype)
    s = sin[:, :, None, :].astype(g.dtype)
    dx = g * c - _rotate_half(g * s)
    dcos = jnp.sum((g * x).astype(jnp.float32), axis=2).astype(cos.dtype)
    dsin = jnp.sum((g * _rotate_half(x)).astype(jnp.float32), axis=2).astype(sin.dtype)
    return dx, dcos, dsin


_rope.defvjp(_rope_fwd, _rope_bwd)


# Logical axes of the activations, for `sharding.constrain` (no-op outside a sharded trace).
EMBED_AXES = ("batch", "length", "embed")
Q_AXES = ("batch", "length", "heads", "head_dim")
KV_AXES = ("batch", "length", "kv_heads", "head_dim")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention. q [B,T,N,H], k/v [B,S,K,H], mask bool broadcastable to [B,1,T,S].

    XLA's `jax.nn.dot_product_attention` (the fallback of every `attention_impl`). Fully masked query
    rows (padding) give finite garbage, never NaN.
    """
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")


def cudnn_supported(q: jax.Array, k: jax.Array) -> bool:
    """Whether cuDNN fused attention takes these shapes here: a GPU, 16-bit operands, head_dim a
    multiple of 8 up to 256 (cuDNN 9 flash attention)."""
    h = q.shape[-1]
    return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16) and k.dtype == q.dtype
            and h % 8 == 0 and h <= 256)


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    scale: float,
    block: int = 128,
    impl: str = "xla",
    segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Self-attention whose `mask` is causal (a subset of it): skips the blocks above the diagonal.

    Same arguments and result as `attention`. `impl` (config `model.attention_impl`) picks the kernel:
    "cudnn" = cuDNN fused attention on GPU (causal, with the packed-segment/padding `mask` as its
    mask input), "splash" = the Pallas splash kernel on TPU (causal, packing through `segment_ids`;
    interpret mode elsewhere, for tests). Shapes a kernel does not take fall back to XLA. On CPU the
    XLA path is `_blocked_attention`: query block i only meets keys [0, (i+1)*block), in a
    head-major layout with a hand-written backward pass.
    """
    self_attn = k.shape[1] == q.shape[1]
    if impl == "cudnn" and self_attn and cudnn_supported(q, k):
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=True, implementation="cudnn")
    if impl == "splash" and self_attn and q.shape[1] % block == 0:
        from mpa_jax.models import splash

        return splash.attention(q, k, v, scale, segment_ids, block=block)
    if jax.default_backend() != "cpu" or not self_attn:
        return attention(q, k, v, mask, scale)
    return _blocked_attention(q, k, v, mask, scale, block)


def _blocked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, block: int) -> jax.Array:
    """Causal GQA attention in query blocks over a head-major layout (CPU).

    Why this layout: XLA:CPU's batched dots want [batch..., rows, cols] operands. Putting the query
    group next to the query position ([B, K, T*G, H], row = t*G + g) makes every block a contiguous
    [B, K, block*G, H] slab with one transpose per tensor per layer, instead of the per-block
    transposes and copies the einsum over [B, T, N, H] paid (they were ~40% of attention time).
    """
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    bs = min(block, t)
    nb = -(-t // bs)
    tp = nb * bs
    mask = jnp.broadcast_to(mask, (mask.shape[0], 1, t, t))
    if tp != t:  # pad the query rows (and their mask rows, all False) to whole blocks
        q = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0)))
        mask = jnp.pad(mask, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
    # [B, T, K, G, H] -> [nb, B, K, bs*G, H]: block-major so each query block is contiguous.
    qb = q.reshape(b, nb, bs, kv, g, h).transpose(1, 0, 3, 2, 4, 5).reshape(nb, b, kv, bs * g, h)
    kh = k.transpose(0, 2, 1, 3)  # [B, K, S, H]
    vh = v.transpose(0, 2, 1, 3)
    outs = []
    for i in range(nb):
        end = min((i + 1) * bs, t)
        m_i = mask[:, :, i * bs : (i + 1) * bs, :end]
        outs.append(_attend(qb[i], kh[:, :, :end], vh[:, :, :end], m_i, scale))
    o = jnp.stack(outs)  # [nb, B, K, bs*G, H]
    o = o.reshape(nb, b, kv, bs, g, h).transpose(1, 0, 3, 2, 4, 5).reshape(b, tp, n, h)
    return o[:, :t]


def cached_attention(
    q: jax.Array, kt: jax.Array, v: jax.Array, mask: jax.Array, scale: float, block: int = 128
) -> jax.Array:
    """Attention of new queries q [B, T, N, H] over a decode cache: keys kt [B, K, H, S], values v [B, K, S, H].

    `mask` bool [B or 1, 1, T, S]; result [B, T, N, H] as `attention`. The keys are stored transposed
    so that both dots are plain [rows, H] x [H, S] and [rows, S] x [S, H] products over the cache as it
    is (on CPU the scores dot over [S, H] keys took ~2x as long per decode step). Only the T query rows
    are transposed. A long prefill runs in query blocks of `block` rows: the float32 scores of a whole
    prompt against the whole cache ([B, K, T*G, S]) reached tens of GB at batch 32 x 2k-token prompts.
    """
    b, t, n, h = q.shape
    if t > block:
        # lax.map runs the blocks one after another, so only one block's scores are alive at a time.
        nb = -(-t // block)
        pad = nb * block - t
        mask = jnp.broadcast_to(mask, (b, 1, t, mask.shape[-1]))
        qb = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, nb, block, n, h).swapaxes(0, 1)
        mb = jnp.pad(mask, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, 1, nb, block, -1).transpose(2, 0, 1, 3, 4)
        out = jax.lax.map(lambda qm: cached_attention(qm[0], kt, v, qm[1], scale, block), (qb, mb))
        return out.swapaxes(0, 1).reshape(b, nb * block, n, h)[:, :t]
    kv = kt.shape[1]
    g = n // kv
    qh = q.reshape(b, t, kv, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv, t * g, h)
    qh = qh * jnp.asarray(scale, qh.dtype)
    s = jnp.einsum("bkmh,bkhs->bkms", qh, kt, preferred_element_type=jnp.float32)
    p = _masked_softmax(s, mask)
    o = jnp.einsum("bkms,bksh->bkmh", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(q.dtype)
    return o.reshape(b, kv, t, g, h).transpose(0, 2, 1, 3, 4).reshape(b, t, n, h)


def _masked_softmax(s: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax over the last axis of float32 scores [B, K, M=rows*G, S] under mask [B or 1, 1, rows, S]."""
    b, kv, m, s_len = s.shape
    rows = mask.shape[2]
    s = s.reshape(b, kv, rows, m // rows, s_len)
    # A large finite fill: fully masked (padding) rows become a uniform average, never NaN.
    s = jnp.where(mask[:, :, :, None, :], s, jnp.float32(-1e30)).reshape(b, kv, m, s_len)
    p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return p * (1.0 / jnp.sum(p, axis=-1, keepdims=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Softmax attention of one head-major block: q [B, K, M=rows*G, H], k/v [B, K, S, H],
    mask bool [B or 1, 1, rows, S] (rows broadcast over the G query heads of a key head)."""
    return _attend_fwd(q, k, v, mask, scale)[0]


def _attend_fwd(q, k, v, mask, scale):
    q = q * jnp.asarray(scale, q.dtype)  # scale the small operand, not the [M, S] scores
    s = jnp.einsum("bkmh,bksh->bkms", q, k, preferred_element_type=jnp.float32)
    p = _masked_softmax(s, mask)
    o = jnp.einsum("bkms,bksh->bkmh", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(q.dtype)
    return o, (q, k, v, p, o)


def _attend_bwd(scale, res, do):
    # Standard softmax-attention gradients from the saved probabilities: dS = P * (dP - rowsum(dO*O)).
    # q here is the scaled query, so dK = dS^T (scale q) and dQ = scale (dS K).
    q, k, v, p, o = res
    f32 = jnp.float32
    dv = jnp.einsum("bkms,bkmh->bksh", p.astype(do.dtype), do, preferred_element_type=f32).astype(v.dtype)
    dp = jnp.einsum("bkmh,bksh->bkms", do, v, preferred_element_type=f32)
    delta = jnp.sum(do.astype(f32) * o.astype(f32), axis=-1, keepdims=True)
    ds = (p * (dp - delta)).astype(q.dtype)
    dq = (jnp.einsum("bkms,bksh->bkmh", ds, k, preferred_element_type=f32) * scale).astype(q.dtype)
    dk = jnp.einsum("bkms,bkmh->bksh", ds, q, preferred_element_type=f32).astype(k.dtype)
    return dq, dk, dv, None


_attend.defvjp(_attend_fwd, _attend_bwd)  # _attend_fwd already returns (output, residuals)


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


def write_columns(cache: jax.Array, new: jax.Array, column: jax.Array, axis: int, live: jax.Array | None = None) -> jax.Array:
    """`new` (the cache with `new.shape[axis]` columns along `axis`) written at `column` of every row.

    `column` is a scalar (one write column shared by every row: one in-place update) or [B] (each row
    its own column: the slot engine's rows, each at its own length). With `live` [B] (per-row columns
    only), rows that are not live keep what they held (their old column is read and written back):
    a row holding a cached prefix past the window is never touched by a masked step.
    """
    if jnp.ndim(column) == 0:
        start = [0] * cache.ndim
        start[axis] = column
        return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), tuple(start))
    t = new.shape[axis]
    column = jnp.clip(column, 0, cache.shape[axis] - t)  # what dynamic_update_slice would do; explicit for the read

    def one(c: jax.Array, n: jax.Array, col: jax.Array, keep: jax.Array) -> jax.Array:
        start = [0] * c.ndim
        start[axis - 1] = col
        n = n.astype(c.dtype)
        if live is not None:
            old = jax.lax.dynamic_slice_in_dim(c, col, t, axis=axis - 1)
            n = jnp.where(keep, n, old)
        return jax.lax.dynamic_update_slice(c, n, tuple(start))

    keep = jnp.ones(column.shape, bool) if live is None else live
    return jax.vmap(one)(cache, new, column, keep)
