"""Scanned layers (`scan_layers=True`): stacked parameters and one lax.scan give the same logits,
gradients, router logits and decode as the unrolled decoder, for Qwen3 (block of 1 layer), Qwen3.5
(the 3:1 DeltaNet/attention block) and Qwen3.5-MoE; Hugging Face checkpoints load into the stacked
layout and save from it byte-identically to the unrolled layout, and transformers agrees."""
import filecmp
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax import models
from mpa_jax.models import scan

QWEN3 = models.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)
QWEN35 = models.ModelConfig(family="qwen3_5", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.25,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            full_attention_interval=4, tie_word_embeddings=True)
SMALL35 = QWEN35.replace(num_hidden_layers=4, full_attention_interval=2)  # 2 blocks of (DeltaNet, attention): cheap to compile
MOE = QWEN35.replace(family="qwen3_5_moe", num_hidden_layers=4, full_attention_interval=2, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=16, shared_expert_intermediate_size=24, expert_layout="fused")


def _period(cfg):
    return 1 if cfg.family == "qwen3" else models.registry.family_module(cfg.family).scan_period(cfg)


def _stacked(cfg, params):
    return {**params, "model": {**params["model"], "layers": scan.stack(params["model"]["layers"], _period(cfg))}}


def _batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 12)), jnp.int32)
    seg = jnp.asarray([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3], jnp.int32)  # packed row and padded row
    return ids, seg


def test_block_period_and_layout():
    assert scan.block_period(["a"] * 6) == 1
    assert scan.block_period(["l", "l", "l", "f"] * 16) == 4
    assert _period(QWEN35) == 4
    shapes = jax.eval_shape(lambda r: models.init_params(QWEN35.replace(scan_layers=True), r), jax.random.key(0))
    layers = shapes["model"]["layers"]
    assert sorted(layers) == ["0", "1", "2", "3"] and "self_attn" in layers["3"] and "linear_attn" in layers["0"]
    assert layers["0"]["mlp"]["down_proj"]["kernel"].shape == (2, 48, 32)  # 8 layers = 2 blocks of 4
    axes = models.param_logical_axes(QWEN35.replace(scan_layers=True))
    assert axes["model"]["layers"]["3"]["self_attn"]["q_proj"]["kernel"] == ("layers", "embed", "heads")
    # A pattern that does not repeat is one block of all layers (still correct, just not shorter to compile).
    odd = QWEN35.replace(scan_layers=True, num_hidden_layers=6, layer_types=("linear_attention",) * 3 + ("full_attention",) * 3)
    assert _period(odd) == 6
    with pytest.raises(ValueError, match="not a multiple of the scanned block"):
        scan.stack_specs([{}] * 6, 4)


def test_scanned_3_to_1_block_forward_equals_unrolled():
    params = models.init_params(QWEN35, jax.random.key(1))
    ids, seg = _batch(QWEN35)
    want = jax.jit(lambda p: models.forward(QWEN35, p, ids, segment_ids=seg))(params)
    scfg = QWEN35.replace(scan_layers=True)
    got = jax.jit(lambda p: models.forward(scfg, p, ids, segment_ids=seg))(_stacked(QWEN35, params))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_scanned_moe_router_logits_equal_unrolled():
    fam = models.registry.family_module("qwen3_5_moe")
    params = models.init_params(MOE, jax.random.key(1))
    ids, seg = _batch(MOE)
    h_want, r_want = jax.jit(lambda p: fam.forward_with_aux(MOE, p, ids, segment_ids=seg))(params)
    scfg = MOE.replace(scan_layers=True)
    h_got, r_got = jax.jit(lambda p: fam.forward_with_aux(scfg, p, ids, segment_ids=seg))(_stacked(MOE, params))
    assert r_got.shape == (MOE.num_hidden_layers, ids.size, MOE.num_experts)
    np.testing.assert_allclose(r_got, r_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_got, h_want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", [QWEN3], ids=["qwen3"])
def test_scanned_forward_and_gradients_equal_unrolled(cfg):
    params = models.init_params(cfg, jax.random.key(1))
    sparams, scfg = _stacked(cfg, params), cfg.replace(scan_layers=True, remat="full")
    ids, seg = _batch(cfg)

    def loss(c, p):
        h = models.hidden_states(c, p, ids, segment_ids=seg)
        return jnp.sum(jnp.square(h.astype(jnp.float32)) * (seg > 0)[..., None])

    want, g_want = jax.jit(jax.value_and_grad(lambda p: loss(cfg, p)))(params)
    got, g_got = jax.jit(jax.value_and_grad(lambda p: loss(scfg, p)))(sparams)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(_stacked(cfg, g_want))):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * float(np.abs(b).max()))  # summation order only


@pytest.mark.parametrize("cfg", [QWEN3], ids=["qwen3"])
def test_scanned_decode_equals_unrolled(cfg):
    params = models.init_params(cfg, jax.random.key(2))
    scfg, sparams = cfg.replace(scan_layers=True), _stacked(cfg, params)
    ids, _ = _batch(cfg, seed=3)
    pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    outs = []
    # Raw params, and the prepared ones (fused q/k/v and gate/up kernels) each layout decodes with.
    for c, p in ((cfg, params), (scfg, sparams), (cfg, models.decode_params(cfg, params)),
                 (scfg, models.decode_params(scfg, sparams))):
        state = models.init_decode_state(c, 2, 16)
        logits, state = jax.jit(lambda p, s: models.decode(c, p, ids, pos, s))(p, state)
        step, _ = models.decode(c, p, ids[:, :1], pos[:, -1:] + 1, state)
        outs.append((logits, step))
    for got in outs[1:]:
        np.testing.assert_allclose(got[0], outs[0][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1], outs[0][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", [QWEN3, QWEN35, MOE], ids=["qwen3", "qwen3_5", "qwen3_5_moe"])
def test_hf_round_trip_both_ways(cfg, tmp_path):
    """Unrolled -> HF -> scanned load equals the stacked params; scanned -> HF writes the same files."""
    params = models.init_params(cfg, jax.random.key(4))
    flat = models.save_pretrained(models.Model(cfg, params), str(tmp_path / "flat"), dtype="float32")
    loaded = models.from_pretrained(flat, scan_layers=True)
    assert loaded.cfg.scan_layers
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(_stacked(cfg, params))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    again = models.save_pretrained(loaded, str(tmp_path / "scanned"), dtype="float32")
    # The same checkpoint: same files, config and tensors (the order of tensors inside a file may differ).
    assert sorted(os.listdir(flat)) == sorted(os.listdir(again))
    _, mismatch, _ = filecmp.cmpfiles(flat, again, ["config.json", "generation_config.json"], shallow=False)
    assert not mismatch
    a, b = _tensors(flat), _tensors(again)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def _tensors(path):
    from safetensors.numpy import load_file

    out = {}
    for f in os.listdir(path):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


def test_scanned_qwen3_matches_transformers(tmp_path):
    import torch
    import transformers

    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)
    transformers.Qwen3ForCausalLM(hf_cfg).save_pretrained(str(tmp_path))
    model = models.from_pretrained(str(tmp_path), scan_layers=True)
    ids = np.random.default_rng(5).integers(0, 96, (2, 10))
    ref = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids)), want, atol=2e-5, rtol=2e-4)


def test_per_expert_moe_layout_cannot_scan():
    with pytest.raises(ValueError, match="fused layout"):
        models.registry.family_module("qwen3_5_moe").hf_mapping(MOE.replace(scan_layers=True, expert_layout="per_expert"))
