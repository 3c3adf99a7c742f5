"""Qwen3 parity with transformers (torch CPU), HF checkpoint round trips, refusal of bad checkpoints."""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import torch  # noqa: E402
import transformers  # noqa: E402

from mpa_jax import models  # noqa: E402
from mpa_jax.models import hf_io  # noqa: E402

# Tiny configs covering GQA ratios 1/2/4, tied/untied, head_dim != hidden/heads, attention bias.
CONFIGS = {
    "mha_tied_hd24": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=24, tie_word_embeddings=True),
    "gqa2_untied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
    "gqa4_untied_hd8_bias": dict(
        hidden_size=48, num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, attention_bias=True
    ),
}
VOCAB = 128


def _hf_model(name: str, seed: int = 0):
    """A tiny random transformers Qwen3 with every parameter (norms and biases too) randomised."""
    torch.manual_seed(seed)
    kw = dict(CONFIGS[name])
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        intermediate_size=96,
        num_hidden_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0 + 1000 * seed},
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        **kw,
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    """(name, hf model, hf dir, our Model loaded from it)."""
    name = request.param
    hf = _hf_model(name, seed=list(CONFIGS).index(name))
    path = str(tmp_path_factory.mktemp(name) / "hf")
    hf.save_pretrained(path)
    return name, hf, path, models.from_pretrained(path, dtype="float32")


def _rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _hf_logits(hf, ids, mask=None, positions=None) -> np.ndarray:
    with torch.no_grad():
        out = hf(
            input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long),
            attention_mask=None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.long),
            position_ids=None if positions is None else torch.as_tensor(np.asarray(positions), dtype=torch.long),
        )
    return out.logits.float().numpy()


def test_logits_match_transformers(pair):
    _, hf, _, model = pair
    ids = np.random.default_rng(1).integers(0, VOCAB, (3, 17))
    ours = model(ids)
    assert ours.shape == (3, 17, VOCAB) and ours.dtype == jnp.float32
    assert _rel_err(ours, _hf_logits(hf, ids)) < 1e-4


def test_left_padding_matches_transformers(pair):
    _, hf, _, model = pair
    rng = np.random.default_rng(2)
    lengths = [12, 7, 3]
    ids = np.zeros((3, 12), np.int64)
    mask = np.zeros((3, 12), np.int64)
    for row, n in enumerate(lengths):
        ids[row, 12 - n :] = rng.integers(3, VOCAB, n)
        mask[row, 12 - n :] = 1
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    ref = _hf_logits(hf, ids, mask, positions)
    ours = np.asarray(model(ids, attention_mask=mask))  # default positions = cumsum(mask) - 1
    real = mask.astype(bool)
    assert np.isfinite(ours).all()
    assert _rel_err(ours[real], ref[real]) < 1e-4
    # Each row also equals the unpadded sequence on its own.
    for row, n in enumerate(lengths):
        alone = _hf_logits(hf, ids[row : row + 1, 12 - n :])[0]
        assert _rel_err(ours[row, 12 - n :], alone) < 1e-4


def test_packed_sequences_match_separate_runs(pair):
    _, hf, _, model = pair
    rng = np.random.default_rng(3)
    lens = [5, 9, 4]  # three documents packed into one row of 18, then 2 padding tokens (segment 0)
    ids = np.concatenate([rng.integers(3, VOCAB, n) for n in lens] + [np.zeros(2, np.int64)])[None]
    seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lens)] + [np.zeros(2, np.int64)])[None]
    ours = np.asarray(model(ids, segment_ids=seg.astype(np.int32)))
    start = 0
    for n in lens:
        ref = _hf_logits(hf, ids[:, start : start + n])
        assert _rel_err(ours[:, start : start + n], ref) < 1e-4
        start += n


def test_round_trip_is_bit_identical_and_loads_in_transformers(pair, tmp_path):
    _, hf, path, model = pair
    out = models.save_pretrained(model, str(tmp_path / "out"), dtype="float32", max_shard_bytes=40_000)
    files = sorted(os.listdir(out))
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= set(files)
    assert sum(f.endswith(".safetensors") for f in files) > 1  # really sharded
    src, dst = hf_io.SafetensorsDir(path), hf_io.SafetensorsDir(out)
    expected = set(src.entries) - ({"lm_head.weight"} if hf.config.tie_word_embeddings else set())
    assert set(dst.entries) == expected
    for name in expected:
        a, b = src.array(name), dst.array(name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reloaded.config._attn_implementation = "eager"
    ids = np.random.default_rng(5).integers(0, VOCAB, (2, 9))
    assert np.array_equal(_hf_logits(reloaded, ids), _hf_logits(hf, ids))
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1


def test_bfloat16_load_and_save(tmp_path):
    bf = _hf_model("gqa2_untied").to(torch.bfloat16)
    src = str(tmp_path / "bf16")
    bf.save_pretrained(src)
    model = models.from_pretrained(src, dtype="bfloat16")
    leaf = model.params["model"]["layers"]["0"]["mlp"]["up_proj"]["kernel"]
    assert leaf.dtype == jnp.bfloat16
    assert model.cfg.checkpoint_dtype == "bfloat16"
    out = models.save_pretrained(model, str(tmp_path / "out"))  # default dtype: the checkpoint's (bf16)
    a, b = hf_io.SafetensorsDir(src), hf_io.SafetensorsDir(out)
    assert set(a.entries) == set(b.entries)
    for n in a.entries:
        assert b.entries[n].dtype == "BF16" and a.array(n).tobytes() == b.array(n).tobytes(), n
    ids = np.random.default_rng(6).integers(0, VOCAB, (2, 8))
    f32 = models.from_pretrained(src, dtype="float32")
    # bf16 compute stays close to the f32 computation of the same bf16 weights.
    assert _rel_err(model(ids), f32(ids)) < 5e-2


def test_sharded_load_places_tensors(pair):
    _, _, path, model = pair
    from mpa_jax import sharding

    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2, "expert": 2})
    sharded = models.from_pretrained(path, mesh=mesh)
    want = sharding.param_shardings(sharded.cfg, mesh)
    for got, w in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(want)):
        assert got.sharding.is_equivalent_to(w, got.ndim)
    flat_a, flat_b = jax.tree.leaves(sharded.params), jax.tree.leaves(model.params)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(flat_a, flat_b))


def test_save_from_sharded_model_with_tokenizer(good_dir, tmp_path):
    from mpa_jax import sharding

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"version": "1.0"}')
    (tok / "tokenizer_config.json").write_text("{}")
    (tok / "notes.txt").write_text("not a tokenizer file")
    mesh = sharding.make_mesh((2, 2, 2, 1))
    model = models.from_pretrained(good_dir, mesh=mesh)
    out = models.save_pretrained(model, str(tmp_path / "out"), tokenizer_dir=str(tok), dtype="float32")
    files = set(os.listdir(out))
    assert {"tokenizer.json", "tokenizer_config.json"} <= files and "notes.txt" not in files
    src, dst = hf_io.SafetensorsDir(good_dir), hf_io.SafetensorsDir(out)
    assert set(src.entries) == set(dst.entries)
    assert all(src.array(n).tobytes() == dst.array(n).tobytes() for n in src.entries)
    with pytest.raises(ValueError, match="tokenizer_dir .* is not a directory"):
        models.save_pretrained(model, str(tmp_path / "out2"), tokenizer_dir=str(tmp_path / "missing"))


# ---- refusals ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("good") / "hf")
    _hf_model("gqa2_untied").save_pretrained(path)
    return path


def _copy(good_dir: str, tmp_path) -> str:
    dst = str(tmp_path / "ckpt")
    shutil.copytree(good_dir, dst)
    return dst


def _edit_config(path: str, **changes) -> None:
    cfg_path = os.path.join(path, "config.json")
    data = json.load(open(cfg_path))
    data.update(changes)
    json.dump(data, open(cfg_path, "w"))


def test_refuses_unknown_architecture(good_dir, tmp_path):
    path = _copy(good_dir, tmp_path)
    _edit_config(path, model_type="llama")
    with pytest.raises(hf_io.CheckpointError, match="model_type 'llama'"):
        models.from_pretrained(path)


def test_refuses_wrong_shape_naming_tensor(good_dir, tmp_path):
    path = _copy(good_dir, tmp_path)
    _edit_config(path, intermediate_size=97)
    with pytest.raises(hf_io.CheckpointError, match=r"model\.layers\.0\.mlp\.\w+_proj\.weight has shape"):
        models.from_pretrained(path)


def test_refuses_unsupported_dtype_naming_tensor(good_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy(good_dir, tmp_path)
    st = os.path.join(path, "model.safetensors")
    tensors = load_file(st)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.float64)
    save_file(tensors, st, metadata={"format": "pt"})
    with pytest.raises(hf_io.CheckpointError, match=r"model\.norm\.weight has dtype F64"):
        models.from_pretrained(path)


def test_refuses_missing_and_unexpected_tensors(good_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy(good_dir, tmp_path)
    st = os.path.join(path, "model.safetensors")
    tensors = load_file(st)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, st, metadata={"format": "pt"})
    with pytest.raises(hf_io.CheckpointError, match=r"q_proj\.bias is not part"):
        models.from_pretrained(path)
    del tensors["model.layers.0.self_attn.q_proj.bias"]
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, st, metadata={"format": "pt"})
    with pytest.raises(hf_io.CheckpointError, match=r"lacks tensor model\.layers\.1\.self_attn\.k_norm\.weight"):
        models.from_pretrained(path)


def test_refuses_sliding_window_and_scaled_rope(good_dir, tmp_path):
    path = _copy(good_dir, tmp_path)
    _edit_config(path, use_sliding_window=True)
    with pytest.raises(hf_io.CheckpointError, match="use_sliding_window"):
        models.from_pretrained(path)
    _edit_config(path, use_sliding_window=False, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(hf_io.CheckpointError, match="rope_type 'yarn'"):
        models.from_pretrained(path)


def test_config_round_trip_keeps_fields():
    hf = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, head_dim=24, num_attention_heads=4,
                                  num_key_value_heads=2, eos_token_id=[2, 3]).to_dict()
    cfg = models.ModelConfig.from_hf(hf)
    assert (cfg.family, cfg.head_dim, cfg.num_key_value_heads, cfg.eos_token_id) == ("qwen3", 24, 2, (2, 3))
    back = cfg.to_hf()
    assert models.ModelConfig.from_hf(back) == cfg
    again = transformers.Qwen3Config(**{k: v for k, v in back.items() if k not in ("architectures", "model_type")})
    assert again.rope_parameters["rope_theta"] == cfg.rope_theta and again.head_dim == 24
