"""Gated delta rule (jnp): chunked and recurrent forms against the naive float64 reference, with an
initial state, grouped heads, left padding and packed segments (nothing may leak into the state)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax.kernels import gated_delta as gd

B, T, HK, HV, DK, DV = 2, 70, 2, 4, 8, 6


def _inputs(seed=0, b=B, t=T):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, t, HK, DK)).astype(np.float32)
    k = rng.normal(size=(b, t, HK, DK)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(b, t, HV, DV)).astype(np.float32)
    g = -rng.uniform(0.01, 1.0, size=(b, t, HV)).astype(np.float32)
    beta = rng.uniform(size=(b, t, HV)).astype(np.float32)
    h0 = rng.normal(size=(b, HV, DK, DV)).astype(np.float32)
    return q, k, v, g, beta, h0


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)


# Jitted once per module: compiling whole functions is much cheaper than eager op-by-op dispatch.
chunked = jax.jit(gd.gated_delta_chunked, static_argnames=("chunk_size", "scale"))
recurrent = jax.jit(gd.gated_delta_recurrent, static_argnames=("scale",))

FORMS = {
    "recurrent": recurrent,
    "chunked16": lambda *a, **kw: chunked(*a, chunk_size=16, **kw),
    "chunked64": lambda *a, **kw: chunked(*a, chunk_size=64, **kw),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_forms_match_reference_with_initial_state_mask_and_segments(form):
    q, k, v, g, beta, h0 = _inputs()
    mask = np.ones((B, T), bool)
    mask[0, :5] = False  # left padding
    mask[1, 30:33] = False  # a hole
    seg = np.zeros((B, T), np.int32)
    seg[1, 20:] = 1
    seg[1, 50:] = 2
    seg[0, 64:] = 3  # a segment starting exactly at a chunk boundary
    kw = dict(initial_state=h0, mask=mask, segment_ids=seg)
    ref_o, ref_s = gd.gated_delta_reference(q, k, v, g, beta, **kw)
    out, state = FORMS[form](q, k, v, g, beta, **kw)
    assert out.shape == (B, T, HV, DV) and state.shape == (B, HV, DK, DV) and state.dtype == jnp.float32
    assert _rel(out, ref_o) < 1e-5
    assert _rel(state, ref_s) < 1e-5
    assert np.all(np.asarray(out)[~mask] == 0)


def test_chunked_equals_recurrent_without_extras():
    q, k, v, g, beta, _ = _inputs(1)
    o1, s1 = recurrent(q, k, v, g, beta)
    o2, s2 = chunked(q, k, v, g, beta, chunk_size=32)
    assert _rel(o2, o1) < 1e-5 and _rel(s2, s1) < 1e-5


def test_left_padding_does_not_leak_into_state():
    """A left-padded run equals the run on the real tokens only, even from a non-zero initial state."""
    q, k, v, g, beta, h0 = _inputs(2)
    pad = 9
    mask = np.ones((B, T), bool)
    mask[:, :pad] = False
    for fn in (lambda *a, **kw: chunked(*a, chunk_size=16, **kw), recurrent):
        out, state = fn(q, k, v, g, beta, initial_state=h0, mask=mask)
        sl = slice(pad, None)
        ref_o, ref_s = fn(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=h0)
        assert _rel(np.asarray(out)[:, pad:], ref_o) < 1e-5
        assert _rel(state, ref_s) < 1e-5


def test_packed_segments_equal_separate_runs():
    """Packing two sequences: the second starts from an empty state; the final state is the second's."""
    q, k, v, g, beta, h0 = _inputs(3, b=1)
    cut = 37
    seg = np.where(np.arange(T) < cut, 1, 2)[None].astype(np.int32)
    out, state = chunked(q, k, v, g, beta, initial_state=h0, segment_ids=seg, chunk_size=16)
    first = slice(0, cut)
    second = slice(cut, None)
    # The separate runs use the (independent) reference.
    o1, _ = gd.gated_delta_reference(q[:, first], k[:, first], v[:, first], g[:, first], beta[:, first], initial_state=h0)
    o2, s2 = gd.gated_delta_reference(q[:, second], k[:, second], v[:, second], g[:, second], beta[:, second])
    assert _rel(np.asarray(out)[:, :cut], o1) < 1e-5
    assert _rel(np.asarray(out)[:, cut:], o2) < 1e-5
    assert _rel(state, s2) < 1e-5


def test_decoding_token_by_token_continues_the_prefill_state():
    q, k, v, g, beta, _ = _inputs(4, b=1, t=20)
    full, full_state = gd.gated_delta_reference(q, k, v, g, beta)
    out, state = chunked(q[:, :13], k[:, :13], v[:, :13], g[:, :13], beta[:, :13], chunk_size=8)
    steps = [out]
    step = jax.jit(gd.gated_delta)
    for t in range(13, 20):
        sl = slice(t, t + 1)
        o, state = step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=state)
        steps.append(o)
    assert _rel(jnp.concatenate(steps, axis=1), full) < 1e-5
    assert _rel(state, full_state) < 1e-5


def test_gradients_of_chunked_and_recurrent_agree():
    q, k, v, g, beta, h0 = _inputs(5, b=1, t=24)

    def loss(fn, *xs):
        o, s = fn(*xs[:5], initial_state=xs[5])
        return jnp.sum(o**2) + jnp.sum(s**2)

    args = tuple(jnp.asarray(x) for x in (q, k, v, g, beta, h0))
    ga = jax.jit(jax.grad(lambda *xs: loss(gd.gated_delta_recurrent, *xs), argnums=tuple(range(6))))(*args)
    gb = jax.jit(jax.grad(
        lambda *xs: loss(lambda *a, **kw: gd.gated_delta_chunked(*a, chunk_size=8, **kw), *xs), argnums=tuple(range(6))
    ))(*args)
    for a, b in zip(ga, gb):
        assert _rel(b, a) < 1e-4


def test_bad_inputs_raise_clear_errors():
    q, k, v, g, beta, h0 = _inputs()
    with pytest.raises(ValueError, match="beta must be"):
        gd.gated_delta_chunked(q, k, v, g, beta[:, :, :2])
    with pytest.raises(ValueError, match="initial_state must be"):
        gd.gated_delta_chunked(q, k, v, g, beta, initial_state=h0[:, :2])
    with pytest.raises(ValueError, match="multiple of Hk"):
        gd.gated_delta_chunked(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="impl must be one of"):
        gd.gated_delta(q, k, v, g, beta, impl="triton")


@pytest.mark.parametrize("c", [24, 64])
def test_unit_lower_inverse_is_exact_and_stable(c):
    rng = np.random.default_rng(6)
    random = np.tril(rng.normal(size=(c, c)), -1)
    ones = np.tril(np.ones((c, c)), -1)  # identical keys: a Neumann series would explode here
    for a in (random * 0.3, ones):
        got = np.asarray(gd.unit_lower_inverse(jnp.asarray(a[None], jnp.float32)))[0]
        want = np.linalg.inv(np.eye(c) + a)
        assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())


def test_identical_keys_stay_accurate():
    """Repeated tokens: k_i . k_j = 1, beta ~ 1, almost no decay (the hardest case for a chunk solve)."""
    q, k, v, g, beta, h0 = _inputs(7, b=1)
    k[:] = k[:, :1]
    beta[:] = 0.99
    g[:] = -1e-3
    ref_o, ref_s = gd.gated_delta_reference(q, k, v, g, beta, initial_state=h0)
    out, state = chunked(q, k, v, g, beta, initial_state=h0, chunk_size=64)
    assert _rel(out, ref_o) < 1e-4 and _rel(state, ref_s) < 1e-4
