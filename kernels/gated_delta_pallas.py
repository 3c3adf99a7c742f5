"""Pallas kernel for the chunked gated delta rule forward; the backward is the jnp form's VJP.

One program per (batch, head) walks the chunks of its sequence in order, keeping the float32 state
[Dk, Dv] in registers/VMEM: per chunk it builds the decay and UT matrices, inverts the unit lower
triangular (I + A) by forward substitution (masked vector ops only), writes the chunk output and
updates the state. The maths is
the same as `gated_delta.chunked_core` (read that first); segment resets and padding arrive folded
into g, beta and the segment counter by `gated_delta.prepare`.

This module is the kernel over prepared inputs only; `gated_delta.gated_delta_pallas` is the public
entry (prepare -> `chunked_pallas` -> finish). It imports nothing from `gated_delta` (no import circle):
the jnp core whose VJP is the backward arrives as the `backward` argument.

On CPU the kernel runs with `interpret=True` (tests); on GPU it lowers through Triton and on TPU
through Mosaic. The default (`interpret=None`) interprets on CPU and compiles elsewhere.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_HI = jax.lax.Precision.HIGHEST


def _dot(a, b):
    return jnp.dot(a, b, precision=_HI, preferred_element_type=jnp.float32)


def _dot_t(a, b):
    """a^T @ b without materialising the transpose."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=_HI, preferred_element_type=jnp.float32)


def _dot_nt(a, b):
    """a @ b^T."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_HI, preferred_element_type=jnp.float32)


def _unit_lower_inverse(a_strict: jax.Array, chunk: int) -> jax.Array:
    """(I + A)^-1 for strictly lower triangular A [C, C] by forward substitution, row by row.

    Row i of the inverse is e_i - sum_{j<i} A[i, j] * row_j. Only masks, broadcasts and reductions
    (no dynamic slicing or small matmuls), so it lowers on Triton and Mosaic alike; it is stable
    where a Neumann series is not (correlated keys make the powers of A explode).
    """
    row = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    col = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    eye = (row == col).astype(jnp.float32)
    a_t = jnp.transpose(a_strict)

    def body(i, inv):
        a_col = jnp.sum(jnp.where(col == i, a_t, 0.0), axis=1, keepdims=True)  # A[i, :] as a column [C, 1]
        new_row = jnp.sum(jnp.where(row == i, eye, 0.0), axis=0, keepdims=True) - jnp.sum(
            a_col * inv, axis=0, keepdims=True
        )
        return jnp.where(row == i, new_row, inv)

    return jax.lax.fori_loop(1, chunk, body, eye)


def _kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s_ref, h0_ref, o_ref, hT_ref, *, chunk: int, n_chunks: int):
    """One (batch, head): q/k [1, Tp, Dk], v [1, Tp, Dv], g/beta/seg [1, Tp, 1], h0 [1, Dk, Dv]."""
    row = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    col = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    causal = row >= col
    strict = row > col
    lower_ones = causal.astype(jnp.float32)

    def body(i, carry):
        state, seg_prev = carry
        sl = pl.ds(pl.multiple_of(i * chunk, chunk), chunk)
        q = q_ref[0, sl, :].astype(jnp.float32)
        k = k_ref[0, sl, :].astype(jnp.float32)
        v = v_ref[0, sl, :].astype(jnp.float32)
        g = g_ref[0, sl, :].astype(jnp.float32)  # [C, 1]
        beta = b_ref[0, sl, :].astype(jnp.float32)  # [C, 1]
        seg = s_ref[0, sl, :]  # [C, 1] float32 segment counter
        cum = _dot(lower_ones, g)  # inclusive cumulative log decay [C, 1] (a matmul: no cumsum needed)
        cum_row = jnp.transpose(cum)  # [1, C]
        seg_row = jnp.transpose(seg)
        live = causal & (seg == seg_row)
        decay = jnp.exp(jnp.where(live, cum - cum_row, -jnp.inf))
        carries = seg == seg_prev  # [C, 1]
        gamma = jnp.where(carries, jnp.exp(cum), 0.0)
        kk = _dot_nt(k, k)
        a_strict = jnp.where(strict, beta * kk * decay, 0.0)
        inv = _unit_lower_inverse(a_strict, chunk)
        u = _dot(inv, beta * v) - _dot(_dot(inv, (beta * gamma) * k), state)
        attn = _dot_nt(q, k) * decay
        out = _dot(q * gamma, state) + _dot(attn, u)
        o_ref[0, sl, :] = out.astype(o_ref.dtype)
        seg_last = seg[chunk - 1:chunk, :]  # [1, 1]
        cum_last = cum[chunk - 1:chunk, :]
        tail = jnp.where(seg == seg_last, jnp.exp(cum_last - cum), 0.0)  # [C, 1]
        gamma_end = gamma[chunk - 1:chunk, :]  # [1, 1]
        state = gamma_end * state + _dot_t(k * tail, u)
        return state, seg_last

    state0 = h0_ref[0].astype(jnp.float32)
    seg0 = jnp.zeros((1, 1), jnp.float32)
    state, _ = jax.lax.fori_loop(0, n_chunks, body, (state0, seg0))
    hT_ref[0] = state


def _forward(q, k, v, g, beta, h0, seg, chunk_size: int, interpret: bool):
    """Prepared head-major inputs (see gated_delta.prepare) -> (out [B,H,T,Dv] f32, state [B,H,Dk,Dv] f32)."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    pad = (-t) % chunk_size
    tp = t + pad
    seg_bh = jnp.broadcast_to(seg[:, None, :], (b, h, t))
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
        g, beta = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
        seg_bh = jnp.pad(seg_bh, ((0, 0), (0, 0), (0, pad)), mode="edge")
    bh = b * h
    flat = lambda x: x.reshape(bh, tp, x.shape[-1])  # noqa: E731
    col = lambda x: x.reshape(bh, tp, 1)  # noqa: E731
    args = (flat(q), flat(k), flat(v), col(g), col(beta), col(seg_bh.astype(jnp.float32)), h0.reshape(bh, dk, dv))
    seq_spec = lambda d: pl.BlockSpec((1, tp, d), lambda i: (i, 0, 0))  # noqa: E731
    state_spec = pl.BlockSpec((1, dk, dv), lambda i: (i, 0, 0))
    out, state = pl.pallas_call(
        functools.partial(_kernel, chunk=chunk_size, n_chunks=tp // chunk_size),
        grid=(bh,),
        in_specs=[seq_spec(dk), seq_spec(dk), seq_spec(dv), seq_spec(1), seq_spec(1), seq_spec(1), state_spec],
        out_specs=[seq_spec(dv), state_spec],
        out_shape=[
            jax.ShapeDtypeStruct((bh, tp, dv), jnp.float32),
            jax.ShapeDtypeStruct((bh, dk, dv), jnp.float32),
        ],
        interpret=interpret,
    )(*args)
    return out.reshape(b, h, tp, dv)[:, :, :t], state.reshape(b, h, dk, dv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def chunked_pallas(q, k, v, g, beta, h0, seg, chunk_size, interpret, backward):
    """Prepared inputs -> (out [B,H,T,Dv] f32, state f32) through the kernel. `backward` is the jnp
    chunked core with the same signature (`gated_delta.chunked_core`): its VJP is this function's."""
    return _forward(q, k, v, g, beta, h0, seg, chunk_size, interpret)


def _chunked_fwd(q, k, v, g, beta, h0, seg, chunk_size, interpret, backward):
    return _forward(q, k, v, g, beta, h0, seg, chunk_size, interpret), (q, k, v, g, beta, h0, seg)


def _chunked_bwd(chunk_size, interpret, backward, res, cotangents):
    # The backward differentiates the jnp chunked form (same maths), recomputing its forward.
    q, k, v, g, beta, h0, seg = res
    _, vjp = jax.vjp(lambda *xs: backward(*xs, seg, chunk_size), q, k, v, g, beta, h0)
    return (*vjp(cotangents), None)


chunked_pallas.defvjp(_chunked_fwd, _chunked_bwd)
