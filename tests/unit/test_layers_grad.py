"""The hand-written backward passes in models/layers.py (CPU blocked attention, RoPE) equal autodiff.

The blocked attention path is taken on CPU only, which is where these tests run; the reference is
`jax.nn.dot_product_attention` differentiated by JAX itself.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax.models import layers


def _inputs(rng, b, t, n, kv, h):
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, t, kv, h)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, t, kv, h)), jnp.float32)
    return q, k, v


@pytest.mark.parametrize("groups, layout", [(1, "left_padding"), (2, "packed"), (4, "left_padding"), (4, "packed")])
def test_blocked_attention_values_and_gradients_equal_autodiff(groups, layout):
    rng = np.random.default_rng(groups)
    b, t, kv, h = 2, 37, 2, 8  # T not a multiple of the block: a ragged last block
    q, k, v = _inputs(rng, b, t, kv * groups, kv, h)
    if layout == "left_padding":
        real = np.ones((b, t), np.int32)
        real[1, :9] = 0
        mask = layers.self_attention_mask(None, jnp.asarray(real), t)
        row_ok = jnp.asarray(real, jnp.float32)
    else:
        seg = np.zeros((b, t), np.int32)
        seg[:, 11:] = 1
        seg[:, 30:] = 2
        mask = layers.self_attention_mask(jnp.asarray(seg), None, t)
        row_ok = jnp.ones((b, t), jnp.float32)
    scale = h**-0.5
    # Padding query rows give finite garbage by contract: weight them 0 in the loss.
    w = jnp.asarray(rng.normal(size=(b, t, kv * groups, h)), jnp.float32) * row_ok[:, :, None, None]

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v, mask, scale) * w)

    blocked = lambda q, k, v, m, s: layers.causal_attention(q, k, v, m, s, block=16)  # noqa: E731
    reference = lambda q, k, v, m, s: jax.nn.dot_product_attention(q, k, v, mask=m, scale=s)  # noqa: E731
    got_val, got = jax.value_and_grad(lambda *a: loss(blocked, *a), argnums=(0, 1, 2))(q, k, v)
    want_val, want = jax.value_and_grad(lambda *a: loss(reference, *a), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(got_val, want_val, rtol=1e-5, atol=1e-4)
    for name, g, r in zip("qkv", got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=2e-5, err_msg=f"d{name}")


def _rope_reference(x, cos, sin):
    """HF's rotary embedding, written out: x * cos + rotate_half(x) * sin, tables broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def test_rope_custom_gradient_equals_autodiff_of_the_plain_rotation():
    rng = np.random.default_rng(0)
    b, t, n, h = 2, 9, 3, 16
    x = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    pos = jnp.asarray(rng.integers(0, 100, size=(b, t)), jnp.int32)
    cos, sin = layers.rope_tables(pos, h, 10_000.0)
    w = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    got = jax.grad(lambda x, c, s: jnp.sum(layers.apply_rope(x, c, s) * w), argnums=(0, 1, 2))(x, cos, sin)
    np.testing.assert_allclose(np.asarray(layers.apply_rope(x, cos, sin)), np.asarray(_rope_reference(x, cos, sin)),
                               rtol=1e-6, atol=1e-6)
    want = jax.grad(lambda x, c, s: jnp.sum(_rope_reference(x, c, s) * w), argnums=(0, 1, 2))(x, cos, sin)
    for name, g, r in zip(("x", "cos", "sin"), got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5, err_msg=f"d{name}")


def test_cached_attention_in_query_blocks_equals_one_block():
    """Long prefills attend in query blocks (bounded memory); the result must not depend on the block."""
    rng = np.random.default_rng(3)
    b, t, kv, g, h, slots = 2, 11, 2, 2, 8, 16
    q = jnp.asarray(rng.normal(size=(b, t, kv * g, h)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, kv, h, slots)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, kv, slots, h)), jnp.float32)
    mask = jnp.asarray(rng.random((b, 1, t, slots)) < 0.7).at[..., 0].set(True)
    whole = layers.cached_attention(q, k, v, mask, 0.3, block=1024)
    blocked = layers.cached_attention(q, k, v, mask, 0.3, block=4)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(whole), rtol=1e-6, atol=1e-6)
    assert blocked.shape == (b, t, kv * g, h)


def _dot_operand_dtypes(hlo: str) -> list[tuple[str, str]]:
    """(lhs dtype, rhs dtype) of every dot in optimized HLO text (fusion bodies included)."""
    import re

    out = []
    for comp in re.split(r"\n\n", hlo):
        types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", comp))
        for lhs, rhs in re.findall(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", comp):
            out.append((types.get(lhs, "?"), types.get(rhs, "?")))
    return out


def test_cpu_bfloat16_matmul_gradients_and_dots():
    """On CPU, 16-bit `dense`/`matmul_f32` keep every dot of the forward and backward pass in bfloat16
    (XLA:CPU upcasts the forms autodiff gives to float32 dots, which skip the bf16 matrix units) and
    their gradients equal float32 autodiff up to bfloat16 rounding."""
    assert jax.default_backend() == "cpu"
    rng = np.random.default_rng(0)
    x32 = jnp.asarray(rng.normal(size=(3, 40, 48)), jnp.float32)
    w32 = jnp.asarray(rng.normal(size=(48, 24)), jnp.float32)
    u32 = jnp.asarray(rng.normal(size=(24, 16)), jnp.float32)
    c = jnp.asarray(rng.normal(size=(120, 16)), jnp.float32)

    def loss(x, w, u):
        y = layers.dense(x, w)  # result in x.dtype
        return jnp.sum(layers.matmul_f32(y.reshape(-1, 24), u.astype(y.dtype)) * c)  # float32 result

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    val, (dx, dw, du) = grad(x32.astype(jnp.bfloat16), w32, u32)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == du.dtype == jnp.float32  # master weights get float32
    ref_val, ref = jax.value_and_grad(loss, argnums=(0, 1, 2))(x32, w32, u32)
    assert abs(float(val) - float(ref_val)) < 2e-2 * float(jnp.abs(ref_val)) + 1.0
    for got, want in zip((dx, dw, du), ref):
        err = float(jnp.abs(got.astype(jnp.float32) - want).max() / jnp.abs(want).max())
        assert err < 2e-2, err
    hlo = grad.lower(x32.astype(jnp.bfloat16), w32, u32).compile().as_text()
    dots = _dot_operand_dtypes(hlo)
    assert len(dots) >= 6 and all(d == ("bf16", "bf16") for d in dots), dots
