"""Model API: config from the experiment config, init, remat and dtype choices, registry dispatch."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax import models
from mpa_jax.config import load_config_file
from mpa_jax.models import registry

VOCAB = 128
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny():
    config = load_config_file(os.path.join(ROOT, "configs", "tiny.py"))
    cfg = models.config_from_ml(config.model).replace(num_hidden_layers=2, vocab_size=512)
    return cfg, models.init_params(cfg, jax.random.key(0))


def test_config_from_tiny_config(tiny):
    cfg, _ = tiny
    assert (cfg.family, cfg.hidden_size, cfg.head_dim, cfg.tie_word_embeddings) == ("qwen3", 128, 32, True)
    assert hash(cfg) == hash(cfg.replace())  # usable as a static jit argument
    with pytest.raises(ValueError, match="config.model.hidden_sise is not a model config field"):
        models.config_from_ml({"hidden_sise": 3})
    with pytest.raises(ValueError, match="remat='sometimes'"):
        cfg.replace(remat="sometimes")
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads"):
        cfg.replace(num_key_value_heads=3)


def test_family_registry():
    assert registry.family_from_model_type("qwen3") == "qwen3"
    assert registry.family_from_model_type("qwen3_5_moe_text") == "qwen3_5_moe"
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        registry.family_from_model_type("gpt2")
    with pytest.raises(ValueError, match="unknown model family 'llama'"):
        registry.family_module("llama")


def test_init_tree_matches_logical_axes_and_hf_names(tiny):
    cfg, params = tiny
    axes = models.param_logical_axes(cfg)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.structure(params) == jax.tree.structure(axes, is_leaf=is_axes)
    for p, a in zip(jax.tree.leaves(params), jax.tree.leaves(axes, is_leaf=is_axes)):
        assert p.ndim == len(a) and p.dtype == jnp.float32
    assert "lm_head" not in params  # tied
    np.testing.assert_array_equal(models.unembedding(cfg, params), params["model"]["embed_tokens"]["weight"].T)
    assert params["model"]["layers"]["1"]["self_attn"]["q_proj"]["kernel"].shape == (128, 4 * 32)
    again = models.init_params(cfg, jax.random.key(0))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)))


def test_forward_is_hidden_times_unembedding(tiny):
    cfg, params = tiny
    ids = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
    fwd = jax.jit(lambda p, i: models.forward(cfg, p, i))
    logits = fwd(params, ids)
    h = jax.jit(lambda p, i: models.hidden_states(cfg, p, i))(params, ids)
    assert h.shape == (2, 10, cfg.hidden_size) and logits.shape == (2, 10, cfg.vocab_size)
    np.testing.assert_allclose(logits, h @ models.unembedding(cfg, params), rtol=1e-5, atol=1e-5)
    # causal: changing a later token leaves earlier logits unchanged
    changed = fwd(params, ids.at[:, 7].set((ids[:, 7] + 1) % cfg.vocab_size))
    np.testing.assert_array_equal(changed[:, :7], logits[:, :7])
    assert not np.allclose(changed[:, 7:], logits[:, 7:])


@pytest.mark.parametrize("remat", ["full", "dots", "dots_no_batch"])
def test_remat_policies_give_same_gradients(tiny, remat):
    cfg, params = tiny
    cfg = cfg.replace(num_hidden_layers=1)
    params = {"model": {**params["model"], "layers": {"0": params["model"]["layers"]["0"]}}}
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, cfg.vocab_size)

    def loss(c):
        return lambda p: jnp.mean(jax.nn.log_softmax(models.forward(c, p, ids))[..., 0])

    g0 = jax.jit(jax.grad(loss(cfg)))(params)
    g1 = jax.jit(jax.grad(loss(cfg.replace(remat=remat))))(params)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bfloat16_compute_with_float32_master_weights(tiny):
    cfg, params = tiny
    bf = cfg.replace(compute_dtype="bfloat16")
    ids = jax.random.randint(jax.random.key(3), (2, 8), 0, cfg.vocab_size)
    h = jax.eval_shape(lambda p: models.hidden_states(bf, p, ids), params)
    assert h.dtype == jnp.bfloat16

    def logits_and_grads(p):
        return models.forward(bf, p, ids), jax.grad(lambda q: models.forward(bf, q, ids).sum())(p)

    logits, grads = jax.jit(logits_and_grads)(params)
    assert logits.dtype == jnp.float32
    ref = jax.jit(lambda p: models.forward(cfg, p, ids))(params)
    assert float(jnp.abs(logits - ref).max() / jnp.abs(ref).max()) < 5e-2
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))  # gradients in master dtype
    p16 = jax.eval_shape(lambda: models.init_params(cfg.replace(param_dtype="bfloat16"), jax.random.key(0)))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))


def test_token_logprobs_match_log_softmax_of_forward(tiny):
    cfg, params = tiny
    ids = jax.random.randint(jax.random.key(4), (2, 9), 0, cfg.vocab_size)
    targets = jnp.roll(ids, -1, axis=1)

    def both(p):
        logp, ent = models.token_logprobs(cfg, p, ids, targets, chunk_size=100, temperature=0.8)
        ref = jax.nn.log_softmax(models.forward(cfg, p, ids) / 0.8)
        return logp, ent, jnp.take_along_axis(ref, targets[..., None], axis=-1)[..., 0], -(jnp.exp(ref) * ref).sum(-1)

    logp, ent, ref_logp, ref_ent = jax.jit(both)(params)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


def test_decode_matches_forward():
    """Left-padded prefill then single-token steps give the logits of the full forward pass."""
    cfg = models.ModelConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, attention_bias=True, rope_theta=10_000.0,
    )
    # scaled so logits are not tiny, shifted so biases are non-zero
    params = jax.tree.map(lambda x: 3.0 * x + 0.01, models.init_params(cfg, jax.random.key(7)))
    rng = np.random.default_rng(4)
    prompt_lens, steps, width = [6, 3], 4, 6
    mask = np.zeros((2, width), np.int32)
    ids = np.zeros((2, width), np.int32)
    for row, n in enumerate(prompt_lens):
        ids[row, width - n :] = rng.integers(3, VOCAB, n)
        mask[row, width - n :] = 1
    new = rng.integers(3, VOCAB, (2, steps)).astype(np.int32)
    full_ids = np.concatenate([ids, new], axis=1)
    full_mask = np.concatenate([mask, np.ones((2, steps), np.int32)], axis=1)
    ref = np.asarray(models.forward(cfg, params, jnp.asarray(full_ids), attention_mask=jnp.asarray(full_mask)))

    decode = jax.jit(lambda p, i, pos, s, m: models.decode(cfg, p, i, pos, s, m))
    state = models.init_decode_state(cfg, 2, width + steps + 2)
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32)
    logits, state = decode(params, ids, pos, state, mask)
    got = [np.asarray(logits)]
    last = pos[:, -1:]
    for s in range(steps):
        last = last + 1
        logits, state = decode(params, new[:, s : s + 1], last, state, np.ones((2, 1), np.int32))
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    real = full_mask.astype(bool)
    assert int(state["index"]) == width + steps
    assert _rel_err(got[real], ref[real]) < 1e-5


def _rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_blocked_causal_attention_equals_full():
    from mpa_jax.models import layers

    b, t, n, kv, h = 2, 256, 4, 2, 8
    q, k, v = (jax.random.normal(jax.random.key(i), (b, t, heads, h)) for i, heads in ((0, n), (1, kv), (2, kv)))
    pad = jnp.ones((b, t), jnp.int32).at[0, :37].set(0)
    seg = jnp.concatenate([jnp.ones((b, 100), jnp.int32), 2 * jnp.ones((b, t - 100), jnp.int32)], axis=1)
    mask = layers.self_attention_mask(seg, pad, t)
    full = layers.attention(q, k, v, mask, 0.3)
    blocked = layers.causal_attention(q, k, v, mask, 0.3, block=64)
    np.testing.assert_allclose(blocked[pad.astype(bool)], full[pad.astype(bool)], rtol=1e-6, atol=1e-6)


def test_attention_impls_select_kernels_and_fall_back_to_xla():
    """`attention_impl`: "splash" runs the Pallas splash kernel (interpret mode off TPU) with packed
    segments and matches XLA on real tokens; "cudnn" off GPU (or on shapes cuDNN does not take) is
    the XLA path itself; a bad name is refused by the config."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest

    from mpa_jax import models
    from mpa_jax.models import layers

    rng = np.random.default_rng(0)
    b, t, n, kv, h = 1, 128, 2, 1, 32
    q, k, v = (jnp.asarray(rng.normal(size=(b, t, nh, h)), jnp.float32) for nh in (n, kv, kv))
    seg = jnp.asarray([[1] * 60 + [2] * 60 + [0] * 8], jnp.int32)
    mask = layers.self_attention_mask(seg, (seg > 0).astype(jnp.int32), t)
    ref = np.asarray(layers.attention(q, k, v, mask, h**-0.5))
    real = np.asarray(seg[0] > 0)
    splash = np.asarray(layers.causal_attention(q, k, v, mask, h**-0.5, impl="splash", segment_ids=seg))
    np.testing.assert_allclose(splash[0, real], ref[0, real], atol=2e-5)
    cudnn = np.asarray(layers.causal_attention(q, k, v, mask, h**-0.5, impl="cudnn", segment_ids=seg))
    assert not layers.cudnn_supported(q, k) or jax.default_backend() == "gpu"
    np.testing.assert_allclose(cudnn[0, real], ref[0, real], atol=2e-5)
    with pytest.raises(ValueError, match="attention_impl"):
        models.ModelConfig(attention_impl="flash")
