"""Pallas gated delta kernel (interpret mode on CPU) against the jnp chunked form: outputs, final
state and gradients (custom VJP), with an initial state, padding and packed segments."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax.kernels import gated_delta as gd
from mpa_jax.kernels.gated_delta import gated_delta_pallas

B, T, HK, HV, DK, DV = 2, 40, 1, 2, 8, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, HK, DK)).astype(np.float32)
    k = rng.normal(size=(B, T, HK, DK)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(B, T, HV, DV)).astype(np.float32)
    g = -rng.uniform(0.01, 1.0, size=(B, T, HV)).astype(np.float32)
    beta = rng.uniform(size=(B, T, HV)).astype(np.float32)
    h0 = rng.normal(size=(B, HV, DK, DV)).astype(np.float32)
    mask = np.ones((B, T), bool)
    mask[1, :6] = False
    seg = np.zeros((B, T), np.int32)
    seg[0, 21:] = 1
    return (q, k, v, g, beta), dict(initial_state=h0, mask=mask, segment_ids=seg)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


def test_pallas_forward_matches_jnp_and_reference():
    args, kw = _inputs()
    ref_o, ref_s = gd.gated_delta_reference(*args, **kw)
    po, ps = jax.jit(lambda *a, **k: gated_delta_pallas(*a, chunk_size=16, interpret=True, **k))(*args, **kw)
    assert _rel(po, ref_o) < 1e-5 and _rel(ps, ref_s) < 1e-5


def test_pallas_gradients_match_jnp():
    args, kw = _inputs(1)
    h0 = jnp.asarray(kw.pop("initial_state"))

    def loss(fn, *xs):
        o, s = fn(*xs[:5], initial_state=xs[5], chunk_size=16, **kw)
        return jnp.sum(jnp.sin(o)) + jnp.sum(s**2)

    xs = tuple(jnp.asarray(x) for x in args) + (h0,)
    pallas = lambda *a, **k: gated_delta_pallas(*a, interpret=True, **k)  # noqa: E731
    ga = jax.jit(jax.grad(lambda *x: loss(pallas, *x), argnums=tuple(range(6))))(*xs)
    gb = jax.jit(jax.grad(lambda *x: loss(gd.gated_delta_chunked, *x), argnums=tuple(range(6))))(*xs)
    for a, b in zip(ga, gb):
        assert _rel(a, b) < 1e-5


def test_dispatch_selects_pallas_and_validates_chunk():
    args, kw = _inputs(2)
    po, _ = jax.jit(lambda *a, **k: gd.gated_delta(*a, chunk_size=16, impl="pallas", **k))(*args, **kw)
    ref_o, _ = gd.gated_delta_reference(*args, **kw)
    assert _rel(po, ref_o) < 1e-5
    with pytest.raises(ValueError, match="power of two"):
        gated_delta_pallas(*args, chunk_size=24, **kw)


def test_pallas_identical_keys_stay_accurate():
    (q, k, v, g, beta), kw = _inputs(3)
    k[:] = k[:, :1]
    beta[:] = 0.99
    g[:] = -1e-3
    ref_o, ref_s = gd.gated_delta_reference(q, k, v, g, beta, **kw)
    po, ps = jax.jit(lambda *a, **k: gated_delta_pallas(*a, chunk_size=32, interpret=True, **k))(q, k, v, g, beta, **kw)
    assert _rel(po, ref_o) < 1e-4 and _rel(ps, ref_s) < 1e-4
