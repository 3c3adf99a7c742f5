"""Qwen3.5 hybrid (dense): logits parity with transformers on a tiny random model (every parameter
randomised, norms included), HF -> JAX -> HF bit-identical round trip, multimodal checkpoint layout,
packed sequences, and prefill + token-by-token decoding against the full forward."""
import glob
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from mpa_jax import models
from mpa_jax.models import qwen3_5

HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)


def randomise(model: torch.nn.Module) -> None:
    """Every parameter random: norms (zero-centred and gated), A_log and dt_bias included."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand_like(p) * 4 + 0.5))
            elif "norm" in name or "dt_bias" in name:
                p.copy_(torch.randn_like(p) * 0.5)
            else:
                p.copy_(torch.randn_like(p) * 0.1)


def tensors(path):
    out = {}
    for f in glob.glob(os.path.join(path, "*.safetensors")):
        out.update(load_file(f))
    return out


def hf_logits(model, ids, mask):
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)
        ).logits.numpy()


def batch(t, vocab=128, seed=0):
    """Two rows of length t; the second is left-padded (when t > 1)."""
    ids = np.random.default_rng(seed).integers(0, vocab, (2, t))
    mask = np.ones((2, t), np.int64)
    mask[1, : min(t - 1, 7)] = 0
    return ids, mask


def rel_err(ours, ref, mask):
    valid = mask.astype(bool)
    return np.abs(ours[valid] - ref[valid]).max() / np.abs(ref[valid]).max()


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    cfg = Qwen3_5TextConfig(**HF_CONFIG)
    cfg._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(cfg).eval()
    randomise(model)
    path = str(tmp_path_factory.mktemp("qwen3_5_hf"))
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def ours(hf):
    return models.from_pretrained(hf[1])


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_logits_match_transformers(hf, ours, t):
    ids, mask = batch(t)
    ref = hf_logits(hf[0], ids, mask)
    out = np.asarray(ours(ids, attention_mask=mask))
    assert out.dtype == np.float32
    assert rel_err(out, ref, mask) < 1e-4


def test_config_is_read_from_checkpoint(ours):
    cfg = ours.cfg
    assert cfg.family == "qwen3_5" and cfg.partial_rotary_factor == 0.25
    assert qwen3_5.layer_types(cfg) == ("linear_attention", "full_attention") * 2
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim) == (2, 4, 4)


def test_round_trip_is_bit_identical_and_loads_in_transformers(hf, ours, tmp_path):
    out = models.save_pretrained(ours, str(tmp_path / "out"))
    a, b = tensors(hf[1]), tensors(out)
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    reloaded = Qwen3_5ForCausalLM.from_pretrained(out).eval()
    ids, mask = batch(30)
    assert rel_err(hf_logits(reloaded, ids, mask), hf_logits(hf[0], ids, mask), mask) < 1e-5


def test_multimodal_checkpoint_loads_text_model_and_ignores_vision_and_mtp(hf, ours, tmp_path, caplog):
    """Released checkpoints: model.language_model.* plus model.visual.* and mtp.* tensors."""
    src = tensors(hf[1])
    mm = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in src.items()}
    mm["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((6, 2), np.float32)
    mm["mtp.fc.weight"] = np.zeros((2, 2), np.float32)
    path = tmp_path / "mm"
    path.mkdir()
    save_file(mm, str(path / "model.safetensors"))
    text = json.load(open(os.path.join(hf[1], "config.json")))
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
              "vision_config": {"depth": 1}, "image_token_id": 7, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.INFO, logger="mpa_jax.models.qwen3_5"):
        model = models.from_pretrained(str(path))
    assert "ignoring 1 vision tower" in caplog.text and "ignoring 1 multi-token prediction" in caplog.text
    assert model.cfg.hf_prefix == "model.language_model."
    # The very same parameters as the text-only checkpoint, hence the same (tested) logits.
    same = jax.tree.map(lambda x, y: np.asarray(x).tobytes() == np.asarray(y).tobytes(), model.params, ours.params)
    assert all(jax.tree.leaves(same))
    out = models.save_pretrained(model, str(tmp_path / "mm_out"))
    saved = tensors(out)
    assert set(saved) == {k for k in mm if not k.startswith(("model.visual.", "mtp."))}
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    assert hf_cfg["model_type"] == "qwen3_5" and hf_cfg["text_config"]["model_type"] == "qwen3_5_text"
    assert hf_cfg["vision_config"] == {"depth": 1}


def test_packed_segments_equal_separate_sequences(hf, ours):
    """Two sequences packed in one row (segment ids) give each sequence's own logits (transformers)."""
    cfg, params = ours.cfg, ours.params
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 128, (1, 23)), rng.integers(0, 128, (1, 41))
    seg = np.array([[1] * 23 + [2] * 41], np.int32)
    out = np.asarray(jax.jit(lambda p, i, s: models.forward(cfg, p, i, segment_ids=s))(params, np.concatenate([a, b], 1), seg))
    for ref, got in ((hf_logits(hf[0], a, np.ones_like(a)), out[:, :23]), (hf_logits(hf[0], b, np.ones_like(b)), out[:, 23:])):
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4


def check_decode(model, prompt=196, steps=4):
    """Left-padded prefill (several delta chunks), then one token per step: logits equal the full forward's."""
    cfg, params = model.cfg, model.params
    t = prompt + steps
    ids, mask = batch(t, cfg.vocab_size, seed=5)
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    full = np.asarray(model(ids, attention_mask=mask))
    step = jax.jit(lambda ids, pos, state, m: models.decode(cfg, params, ids, pos, state, m))
    state = models.init_decode_state(cfg, 2, t)
    logits, state = step(ids[:, :prompt], pos[:, :prompt], state, mask[:, :prompt])
    outs = [np.asarray(logits)]
    for i in range(prompt, t):
        logits, state = step(ids[:, i : i + 1], pos[:, i : i + 1], state, mask[:, i : i + 1])
        outs.append(np.asarray(logits))
    assert int(state["index"]) == t
    assert rel_err(np.concatenate(outs, axis=1), full, mask) < 1e-5


def test_prefill_then_decode_reproduces_forward(ours):
    check_decode(ours)


def test_pallas_impl_gives_the_same_logits(ours):
    cfg = ours.cfg.replace(delta_impl="pallas", delta_chunk_size=16)
    ids, mask = batch(64)
    out = np.asarray(jax.jit(lambda p: models.forward(cfg, p, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))(ours.params))
    ref = np.asarray(ours(ids, attention_mask=mask))
    assert rel_err(out, ref, mask) < 1e-5


def test_bad_config_is_rejected():
    base = models.ModelConfig(family="qwen3_5", num_hidden_layers=2, head_dim=16, partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match="layer_types contains"):
        models.param_count(base.replace(layer_types=("linear_attention", "sliding")))
    with pytest.raises(ValueError, match="layer_types has 1 entries"):
        models.param_count(base.replace(layer_types=("full_attention",)))
    with pytest.raises(ValueError, match="delta_impl"):
        models.param_count(base.replace(delta_impl="cuda"))
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        models.param_count(base.replace(linear_num_value_heads=3, linear_num_key_heads=2))
