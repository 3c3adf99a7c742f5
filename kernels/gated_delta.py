"""Gated delta rule (Gated DeltaNet linear attention), pure jnp, float32 state.

The recurrence, per value head, with state S of shape [Dk, Dv]:

    S_t = a_t * S_{t-1} + k_t u_t^T,   u_t = beta_t * (v_t - a_t * S_{t-1}^T k_t),   o_t = S_t^T q_t * scale

where a_t = exp(g_t) (g_t <= 0 is the log decay). Three forms compute it:

- `gated_delta_reference`: a naive per-token loop in float64 NumPy, the ground truth for tests.
- `gated_delta_recurrent`: a `lax.scan` over tokens (decoding, and short prefills).
- `gated_delta_chunked`: the chunked (UT-transform) form for training and prefill: inside a chunk of C
  tokens the updates are condensed into a few C x C matmuls and one triangular solve; a scan carries
  the state across chunks.

All three take q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv] (Hv a multiple of Hk: each
q/k head serves Hv/Hk consecutive value heads), an optional initial state [B, Hv, Dk, Dv], an optional
`mask` [B, T] (False = padding: the token neither decays nor writes the state, its output is 0) and
optional `segment_ids` [B, T] (packed sequences: the state is reset to zero where the id changes, so
nothing leaks between segments; the initial state belongs to the first segment). They return
(output [B, T, Hv, Dv] in v's dtype, final state [B, Hv, Dk, Dv] float32).
q and k are used as given (the model L2-normalises them); `scale` defaults to Dk ** -0.5.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

_HI = jax.lax.Precision.HIGHEST  # float32 parity on TPU/GPU, where the default matmul precision is lower


def _check_shapes(q, k, v, g, beta, initial_state, mask, segment_ids) -> None:
    """Raise one clear error naming the first input whose shape does not fit."""
    if q.ndim != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, Hk, Dk]; got q {q.shape}, k {k.shape}")
    b, t, hk, dk = q.shape
    if v.ndim != 4 or v.shape[:2] != (b, t) or v.shape[2] % hk:
        raise ValueError(f"v must be [B, T, Hv, Dv] with Hv a multiple of Hk={hk}; got {v.shape} for q {q.shape}")
    hv, dv = v.shape[2:]
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (b, t, hv):
            raise ValueError(f"{name} must be [B, T, Hv] = {(b, t, hv)}; got {x.shape}")
    if initial_state is not None and initial_state.shape != (b, hv, dk, dv):
        raise ValueError(f"initial_state must be [B, Hv, Dk, Dv] = {(b, hv, dk, dv)}; got {initial_state.shape}")
    for name, x in (("mask", mask), ("segment_ids", segment_ids)):
        if x is not None and x.shape != (b, t):
            raise ValueError(f"{name} must be [B, T] = {(b, t)}; got {x.shape}")


def segment_index(segment_ids: Optional[jax.Array], batch: int, length: int) -> jax.Array:
    """Monotone segment counter [B, T] int32: 0 at t=0, +1 wherever segment_ids changes."""
    if segment_ids is None:
        return jnp.zeros((batch, length), jnp.int32)
    change = jnp.concatenate(
        [jnp.zeros((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    return jnp.cumsum(change.astype(jnp.int32), axis=1)


def prepare(q, k, v, g, beta, initial_state, mask, segment_ids, scale):
    """Shared preprocessing: GQA expansion, float32, head-major [B, H, T, D], masking folded into g/beta.

    Returns (q, k, v, g, beta, h0, seg) with q already multiplied by `scale`; padded tokens get
    g = 0 (no decay) and beta = 0 (no write), so they leave the state untouched.
    """
    _check_shapes(q, k, v, g, beta, initial_state, mask, segment_ids)
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    rep = hv // hk
    if rep > 1:
        q = jnp.repeat(q, rep, axis=2)
        k = jnp.repeat(k, rep, axis=2)
    if scale is None:
        scale = dk**-0.5
    f32 = jnp.float32
    q = jnp.swapaxes(q.astype(f32), 1, 2) * scale
    k = jnp.swapaxes(k.astype(f32), 1, 2)
    v = jnp.swapaxes(v.astype(f32), 1, 2)
    g = jnp.swapaxes(g.astype(f32), 1, 2)
    beta = jnp.swapaxes(beta.astype(f32), 1, 2)
    if mask is not None:
        m = mask.astype(bool)[:, None, :]
        g = jnp.where(m, g, 0.0)
        beta = jnp.where(m, beta, 0.0)
    h0 = jnp.zeros((b, hv, dk, dv), f32) if initial_state is None else initial_state.astype(f32)
    seg = segment_index(segment_ids, b, t)
    return q, k, v, g, beta, h0, seg


def _finish(out, mask, dtype):
    """[B, H, T, Dv] -> [B, T, H, Dv] in `dtype`, zero on padded tokens."""
    out = jnp.swapaxes(out, 1, 2)
    if mask is not None:
        out = jnp.where(mask.astype(bool)[:, :, None, None], out, 0.0)
    return out.astype(dtype)


def gated_delta_reference(q, k, v, g, beta, *, initial_state=None, mask=None, segment_ids=None, scale=None):
    """Naive per-token loop in float64 NumPy: the ground truth the fast forms are tested against."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    rep = hv // hk
    scale = dk**-0.5 if scale is None else scale
    state = np.zeros((b, hv, dk, dv)) if initial_state is None else np.array(initial_state, np.float64)
    mask = np.ones((b, t), bool) if mask is None else np.asarray(mask, bool)
    seg = None if segment_ids is None else np.asarray(segment_ids)
    out = np.zeros((b, t, hv, dv))
    for bi in range(b):
        for ti in range(t):
            if seg is not None and ti > 0 and seg[bi, ti] != seg[bi, ti - 1]:
                state[bi] = 0.0  # a new packed segment starts from an empty state
            if not mask[bi, ti]:
                continue
            for h in range(hv):
                qt, kt = q[bi, ti, h // rep], k[bi, ti, h // rep]
                s = state[bi, h] * np.exp(g[bi, ti, h])
                u = beta[bi, ti, h] * (v[bi, ti, h] - s.T @ kt)
                s = s + np.outer(kt, u)
                state[bi, h] = s
                out[bi, ti, h] = s.T @ qt * scale
    return out, state


def gated_delta_recurrent(q, k, v, g, beta, *, initial_state=None, mask=None, segment_ids=None, scale=None):
    """Token-by-token `lax.scan` (decode form). Same arguments and results as the module docstring."""
    dtype = v.dtype
    q, k, v, g, beta, h0, seg = prepare(q, k, v, g, beta, initial_state, mask, segment_ids, scale)
    reset = jnp.concatenate([jnp.zeros_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)

    def step(state, xs):
        qt, kt, vt, gt, bt, rt = xs  # [B,H,Dk], [B,H,Dk], [B,H,Dv], [B,H], [B,H], [B]
        a = jnp.where(rt[:, None], 0.0, jnp.exp(gt))
        state = state * a[..., None, None]
        kv = jnp.einsum("bhkv,bhk->bhv", state, kt, precision=_HI)
        u = bt[..., None] * (vt - kv)
        state = state + kt[..., :, None] * u[..., None, :]
        ot = jnp.einsum("bhkv,bhk->bhv", state, qt, precision=_HI)
        return state, ot

    xs = (
        jnp.moveaxis(q, 2, 0),
        jnp.moveaxis(k, 2, 0),
        jnp.moveaxis(v, 2, 0),
        jnp.moveaxis(g, 2, 0),
        jnp.moveaxis(beta, 2, 0),
        jnp.moveaxis(reset, 1, 0),
    )
    state, out = jax.lax.scan(step, h0, xs)
    return _finish(jnp.moveaxis(out, 0, 2), mask, dtype), state


def chunk_tensors(q, k, v, g, beta, seg, chunk_size: int):
    """Pad T to a multiple of C and split into chunks: [B, H, N, C, D] / [B, H, N, C] / seg [B, N, C].

    Padding tokens get g = beta = 0 and the segment index of the last real token, so they are inert.
    """
    t = q.shape[2]
    pad = (-t) % chunk_size
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
        g, beta = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
        seg = jnp.pad(seg, ((0, 0), (0, pad)), mode="edge")
    n = (t + pad) // chunk_size
    b, h = q.shape[:2]
    q, k, v = (x.reshape(b, h, n, chunk_size, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(b, h, n, chunk_size) for x in (g, beta))
    seg = seg.reshape(b, n, chunk_size)
    return q, k, v, g, beta, seg


def chunk_prev_segment(seg):
    """Segment index of the token just before each chunk [B, N] (the first chunk continues segment 0)."""
    last = seg[:, :, -1]
    return jnp.concatenate([jnp.zeros_like(last[:, :1]), last[:, :-1]], axis=1)


def unit_lower_inverse(a_strict: jax.Array) -> jax.Array:
    """(I + A)^-1 for strictly lower triangular A [..., C, C], by block recursion (matmuls only).

    Bottom-up: the inverse of each diagonal block of size 2s is assembled from the inverses of its
    two halves as [[X11, 0], [-X22 M21 X11, X22]]. Every intermediate is a block of the true inverse,
    so this is as stable as forward substitution (a Neumann series is not: with correlated keys the
    powers of A grow like binomial coefficients and cancel catastrophically in float32), and far
    faster than a batched triangular solve on CPU.
    """
    c = a_strict.shape[-1]
    size = 1 << max(c - 1, 0).bit_length()  # next power of two; padding extends with the identity
    if size != c:
        pad = [(0, 0)] * (a_strict.ndim - 2) + [(0, size - c), (0, size - c)]
        a_strict = jnp.pad(a_strict, pad)
    lead = a_strict.shape[:-2]
    m = a_strict + jnp.eye(size, dtype=a_strict.dtype)
    inv = jnp.ones(lead + (size, 1, 1), a_strict.dtype)  # inverses of the 1x1 diagonal blocks
    s = 1
    while s < size:
        nb = size // (2 * s)
        blocks = m.reshape(lead + (nb, 2 * s, nb, 2 * s))
        blocks = jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [..., nb, 2s, 2s]
        pairs = inv.reshape(lead + (nb, 2, s, s))
        x11, x22 = pairs[..., 0, :, :], pairs[..., 1, :, :]
        x21 = -jnp.matmul(jnp.matmul(x22, blocks[..., s:, :s], precision=_HI), x11, precision=_HI)
        top = jnp.concatenate([x11, jnp.zeros_like(x11)], axis=-1)
        bottom = jnp.concatenate([x21, x22], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)
        s *= 2
    return inv[..., 0, :c, :c]


def chunked_core(q, k, v, g, beta, h0, seg, chunk_size: int = 64):
    """Chunked gated delta rule on prepared head-major float32 inputs (see `prepare`).

    Returns (out [B, H, T, Dv] float32, final state [B, H, Dk, Dv] float32).
    """
    t = q.shape[2]
    q, k, v, g, beta, seg = chunk_tensors(q, k, v, g, beta, seg, chunk_size)
    c = chunk_size
    seg_prev = chunk_prev_segment(seg)  # [B, N]
    cum = jnp.cumsum(g, axis=-1)  # [B, H, N, C] log decay from the chunk start
    idx = jnp.arange(c)
    causal = idx[:, None] >= idx[None, :]
    same = seg[:, None, :, :, None] == seg[:, None, :, None, :]  # [B, 1, N, C, C]
    live = causal & same
    # exp(cum_i - cum_j) for j <= i in the same segment, else 0 (masked before exp: no overflow).
    decay_ij = jnp.exp(jnp.where(live, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    # Decay from the incoming state to token i, zero once a new segment has started in this chunk.
    carries = (seg == seg_prev[..., None])[:, None]  # [B, 1, N, C]
    gamma = jnp.where(carries, jnp.exp(cum), 0.0)

    kk = jnp.einsum("bhnid,bhnjd->bhnij", k, k, precision=_HI)
    strict = jnp.where(idx[:, None] > idx[None, :], 1.0, 0.0)
    a_mat = beta[..., :, None] * kk * decay_ij * strict
    # u = (I + A)^-1 (beta v - beta gamma K S0): both right-hand sides use one inverse per chunk.
    inv = unit_lower_inverse(a_mat)
    dv = v.shape[-1]
    u_v = jnp.matmul(inv, beta[..., None] * v, precision=_HI)
    w = jnp.matmul(inv, (beta * gamma)[..., None] * k, precision=_HI)
    attn = jnp.einsum("bhnid,bhnjd->bhnij", q, k, precision=_HI) * decay_ij
    q_dec = q * gamma[..., None]
    # Key weights into the end-of-chunk state: exp(cum_C - cum_j) within the last token's segment.
    tail_live = seg == seg[..., -1:]  # [B, N, C]
    k_tail = k * jnp.where(tail_live[:, None], jnp.exp(cum[..., -1:] - cum), 0.0)[..., None]
    gamma_end = gamma[..., -1]  # [B, H, N]

    def step(state, xs):
        u_v_c, w_c, attn_c, q_dec_c, k_tail_c, gend_c = xs
        u = u_v_c - jnp.einsum("bhck,bhkv->bhcv", w_c, state, precision=_HI)
        out = jnp.einsum("bhck,bhkv->bhcv", q_dec_c, state, precision=_HI) + jnp.einsum(
            "bhij,bhjv->bhiv", attn_c, u, precision=_HI
        )
        state = gend_c[..., None, None] * state + jnp.einsum("bhck,bhcv->bhkv", k_tail_c, u, precision=_HI)
        return state, out

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u_v, w, attn, q_dec, k_tail, gamma_end))
    state, out = jax.lax.scan(step, h0, xs)
    out = jnp.moveaxis(out, 0, 2)  # [B, H, N, C, Dv]
    out = out.reshape(out.shape[0], out.shape[1], -1, dv)[:, :, :t]
    return out, state


def gated_delta_chunked(
    q, k, v, g, beta, *, initial_state=None, mask=None, segment_ids=None, scale=None, chunk_size: int = 64
):
    """Chunked form (training and prefill). Same arguments and results as the module docstring."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    dtype = v.dtype
    q, k, v, g, beta, h0, seg = prepare(q, k, v, g, beta, initial_state, mask, segment_ids, scale)
    out, state = chunked_core(q, k, v, g, beta, h0, seg, chunk_size)
    return _finish(out, mask, dtype), state


def gated_delta_pallas(
    q, k, v, g, beta, *, initial_state=None, mask=None, segment_ids=None, scale=None,
    chunk_size: int = 64, interpret: bool | None = None,
):
    """Chunked form through the Pallas kernel (`gated_delta_pallas.py`); arguments and results as
    `gated_delta_chunked`.

    `chunk_size` must be a power of two >= 16 (GPU/TPU tile shapes). `interpret=None` interprets on
    CPU and compiles on GPU/TPU.
    """
    from mpa_jax.kernels.gated_delta_pallas import chunked_pallas  # lazy: the Pallas import is heavy

    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"Pallas gated delta chunk_size must be a power of two >= 16; got {chunk_size}")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    dtype = v.dtype
    q, k, v, g, beta, h0, seg = prepare(q, k, v, g, beta, initial_state, mask, segment_ids, scale)
    out, state = chunked_pallas(q, k, v, g, beta, h0, seg, chunk_size, interpret, chunked_core)
    return _finish(out, mask, dtype), state


IMPLS = ("jnp", "pallas")


def gated_delta(
    q, k, v, g, beta, *, initial_state=None, mask=None, segment_ids=None, scale=None,
    chunk_size: int = 64, impl: str = "jnp",
):
    """The gated delta rule for a whole sequence, by `impl` ("jnp" chunked, or the "pallas" kernel).

    A single token (T == 1, decoding) always takes the recurrent form: it is exact and cheapest.
    """
    if impl not in IMPLS:
        raise ValueError(f"gated delta impl must be one of {IMPLS}; got {impl!r}")
    kwargs = dict(initial_state=initial_state, mask=mask, segment_ids=segment_ids, scale=scale)
    if q.shape[1] == 1:
        return gated_delta_recurrent(q, k, v, g, beta, **kwargs)
    if impl == "pallas":
        return gated_delta_pallas(q, k, v, g, beta, chunk_size=chunk_size, **kwargs)
    return gated_delta_chunked(q, k, v, g, beta, chunk_size=chunk_size, **kwargs)
