"""Chunked log-probs match the naive computation (values and gradients) and keep memory bounded."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax.kernels.logprobs import chunked_logprobs, naive_logprobs


def _inputs(b=2, t=5, d=16, v=300, seed=0, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k1, (b, t, d), jnp.float32).astype(dtype)
    w = (jax.random.normal(k2, (d, v), jnp.float32) * 0.7).astype(dtype)
    y = jax.random.randint(k3, (b, t), 0, v)
    return h, w, y


def _loss(fn, h, w, y, a, b):
    logp, ent = fn(h, w, y)
    return jnp.sum(a * logp) + jnp.sum(b * ent)


@pytest.mark.parametrize("chunk,temperature", [(64, 1.0), (7, 0.7), (1000, 1.3)])
def test_values_and_gradients_match_naive(chunk, temperature):
    h, w, y = _inputs()
    a = jax.random.normal(jax.random.key(1), y.shape)
    b = jax.random.normal(jax.random.key(2), y.shape)
    chunked = lambda h, w, y: chunked_logprobs(h, w, y, chunk_size=chunk, temperature=temperature)  # noqa: E731
    naive = lambda h, w, y: naive_logprobs(h, w, y, temperature=temperature)  # noqa: E731
    lp_c, ent_c = jax.jit(chunked)(h, w, y)
    lp_n, ent_n = naive(h, w, y)
    assert lp_c.dtype == jnp.float32 and ent_c.dtype == jnp.float32
    np.testing.assert_allclose(lp_c, lp_n, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent_c, ent_n, rtol=1e-5, atol=1e-5)
    g_c = jax.jit(jax.grad(lambda h, w: _loss(chunked, h, w, y, a, b), argnums=(0, 1)))(h, w)
    g_n = jax.grad(lambda h, w: _loss(naive, h, w, y, a, b), argnums=(0, 1))(h, w)
    for got, want in zip(g_c, g_n):
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(got / scale, want / scale, atol=1e-5)


def test_bfloat16_inputs_give_float32_and_bf16_grads():
    h, w, y = _inputs(dtype=jnp.bfloat16)
    lp_c, ent_c = chunked_logprobs(h, w, y, chunk_size=64)
    lp_n, ent_n = naive_logprobs(h, w, y)
    assert lp_c.dtype == jnp.float32
    np.testing.assert_allclose(lp_c, lp_n, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ent_c, ent_n, rtol=1e-4, atol=1e-4)
    gh, gw = jax.grad(lambda h, w: chunked_logprobs(h, w, y, chunk_size=64)[0].sum(), argnums=(0, 1))(h, w)
    assert gh.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16


def test_no_full_float32_logits_in_forward_or_backward():
    """The compiled grad program's buffers never reach one [N, V] float32 array."""
    b, t, d, v = 4, 64, 32, 8192
    h, w, y = _inputs(b, t, d, v)
    full = b * t * v * 4

    def temp_bytes(fn):
        compiled = jax.jit(jax.grad(lambda h, w: fn(h, w, y)[0].sum() + fn(h, w, y)[1].sum(), argnums=(0, 1))).lower(h, w).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    chunked = temp_bytes(lambda h, w, y: chunked_logprobs(h, w, y, chunk_size=512))
    naive = temp_bytes(naive_logprobs)
    assert naive >= full  # the reference does hold [N, V] float32
    assert chunked < full / 2, (chunked, full)


def test_bad_shapes_are_refused():
    h, w, y = _inputs()
    with pytest.raises(ValueError, match="hidden width"):
        chunked_logprobs(h, w[:-1], y)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs(h, w, y[:, :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(h, w, y, chunk_size=0)
