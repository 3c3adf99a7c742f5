"""Qwen3.5-MoE: logits and load-balancing loss parity with transformers on a tiny random model,
per-expert and fused expert checkpoints (both load, both round-trip bit-identically), grouped-matmul
experts against a per-expert loop, expert-sharded forward, and decoding."""
import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import load_balancing_loss_func

from mpa_jax import models, sharding
from mpa_jax.models import moe, qwen3_5_moe

E, K = 8, 2
HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    full_attention_interval=2, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)


def randomise(model):
    torch.manual_seed(1)
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


def batch(t, seed=0):
    ids = np.random.default_rng(seed).integers(0, 128, (2, t))
    mask = np.ones((2, t), np.int64)
    mask[1, : min(t - 1, 7)] = 0
    return ids, mask


def hf_out(model, ids, mask):
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos),
                     output_router_logits=True)


def rel_err(ours, ref, mask):
    valid = mask.astype(bool)
    return np.abs(ours[valid] - ref[valid]).max() / np.abs(ref[valid]).max()


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    cfg = Qwen3_5MoeTextConfig(**HF_CONFIG)
    cfg._attn_implementation = "eager"
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    randomise(model)
    path = str(tmp_path_factory.mktemp("qwen3_5_moe_hf"))
    model.save_pretrained(path)  # transformers writes per-expert tensors
    return model, path


@pytest.fixture(scope="module")
def ours(hf):
    return models.from_pretrained(hf[1])


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_logits_match_transformers(hf, ours, t):
    ids, mask = batch(t)
    ref = hf_out(hf[0], ids, mask).logits.numpy()
    assert rel_err(np.asarray(ours(ids, attention_mask=mask)), ref, mask) < 1e-4


def test_load_balancing_loss_matches_transformers(hf, ours):
    ids, mask = batch(40)
    out = hf_out(hf[0], ids, mask)
    ref = float(load_balancing_loss_func(out.router_logits, E, K, torch.tensor(mask)))
    _, router = jax.jit(lambda p: qwen3_5_moe.forward_with_aux(ours.cfg, p, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))(ours.params)
    assert router.shape == (2, 2 * 40, E)
    ours_loss = float(qwen3_5_moe.load_balancing_loss(ours.cfg, router, jnp.asarray(mask)))
    assert abs(ours_loss / ours.cfg.router_aux_loss_coef - ref) < 1e-5 * ref
    # It is differentiable (what training needs): the gradient reaches the router logits.
    grad = jax.grad(lambda r: qwen3_5_moe.load_balancing_loss(ours.cfg, r, jnp.asarray(mask)))(router)
    assert float(jnp.abs(grad).sum()) > 0


def test_per_expert_round_trip_is_bit_identical(hf, ours, tmp_path):
    assert ours.cfg.expert_layout == "per_expert"
    out = models.save_pretrained(ours, str(tmp_path / "out"))
    a, b = tensors(hf[1]), tensors(out)
    assert set(a) == set(b)
    assert all(a[n].dtype == b[n].dtype and a[n].tobytes() == b[n].tobytes() for n in a)


def test_fused_expert_checkpoint_loads_and_round_trips(hf, ours, tmp_path):
    src = tensors(hf[1])
    fused = {k: v for k, v in src.items() if ".mlp.experts." not in k}
    for layer in range(2):
        pre = f"model.layers.{layer}.mlp.experts"
        fused[f"{pre}.gate_up_proj"] = np.stack(
            [np.concatenate([src[f"{pre}.{e}.gate_proj.weight"], src[f"{pre}.{e}.up_proj.weight"]]) for e in range(E)]
        )
        fused[f"{pre}.down_proj"] = np.stack([src[f"{pre}.{e}.down_proj.weight"] for e in range(E)])
    path = tmp_path / "fused"
    path.mkdir()
    save_file(fused, str(path / "model.safetensors"))
    shutil.copy(os.path.join(hf[1], "config.json"), path / "config.json")
    # transformers reads this layout too: it is a real fused checkpoint.
    ids, mask = batch(24)
    ref = hf_out(Qwen3_5MoeForCausalLM.from_pretrained(str(path)).eval(), ids, mask).logits.numpy()
    model = models.from_pretrained(str(path))  # the layout is detected from the tensor names
    assert model.cfg.expert_layout == "fused"
    assert rel_err(np.asarray(model(ids, attention_mask=mask)), ref, mask) < 1e-4
    out = tensors(models.save_pretrained(model, str(tmp_path / "fused_out")))
    assert set(out) == set(fused)
    assert all(out[n].tobytes() == fused[n].tobytes() for n in fused)


def test_grouped_experts_equal_a_per_expert_loop():
    rng = np.random.default_rng(0)
    n, d, i = 13, 16, 8
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    gate_up = jnp.asarray(rng.normal(size=(E, 2 * i, d)), jnp.float32)
    down = jnp.asarray(rng.normal(size=(E, d, i)), jnp.float32)
    router = jnp.asarray(rng.normal(size=(E, d)), jnp.float32)
    _, w, idx = moe.route(x, router, K)
    assert np.allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)
    got = np.asarray(moe.routed_experts({"gate_up_proj": gate_up, "down_proj": down}, x, w, idx))
    want = np.zeros((n, d))
    xs, gu, dn, ww, ii = (np.asarray(a, np.float64) for a in (x, gate_up, down, w, idx))
    for t in range(n):
        for j in range(K):
            e = int(ii[t, j])
            h = gu[e] @ xs[t]
            act = h[:i] / (1 + np.exp(-h[:i])) * h[i:]
            want[t] += ww[t, j] * (dn[e] @ act)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_expert_sharded_forward_matches_unsharded(ours):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 1, "expert": 4})
    params = sharding.shard_params(ours.params, ours.cfg, mesh)
    down = params["model"]["layers"]["0"]["mlp"]["experts"]["down_proj"]
    assert down.sharding.spec[0] == "expert"
    ids, mask = batch(64)
    put = lambda x: jax.device_put(jnp.asarray(x), sharding.batch_sharding(mesh))  # noqa: E731
    out = np.asarray(jax.jit(lambda p, i, m: models.forward(ours.cfg, p, i, attention_mask=m))(params, put(ids), put(mask)))
    ref = np.asarray(ours(ids, attention_mask=mask))
    assert rel_err(out, ref, mask) < 1e-5


def test_prefill_then_decode_reproduces_forward(ours):
    """Left-padded prefill of 196 tokens (several delta chunks), then 4 single-token steps."""
    cfg, params = ours.cfg, ours.params
    t, prompt = 200, 196
    ids, mask = batch(t, seed=4)
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    full = np.asarray(ours(ids, attention_mask=mask))
    step = jax.jit(lambda i, p, s, m: models.decode(cfg, params, i, p, s, m))
    state = models.init_decode_state(cfg, 2, t)
    logits, state = step(ids[:, :prompt], pos[:, :prompt], state, mask[:, :prompt])
    outs = [np.asarray(logits)]
    for i in range(prompt, t):
        logits, state = step(ids[:, i : i + 1], pos[:, i : i + 1], state, mask[:, i : i + 1])
        outs.append(np.asarray(logits))
    assert int(state["index"]) == t
    assert rel_err(np.concatenate(outs, axis=1), full, mask) < 1e-5


def test_config_round_trip_keeps_moe_fields(ours):
    hf_cfg = ours.cfg.to_hf()
    assert hf_cfg["model_type"] == "qwen3_5_moe_text" and hf_cfg["architectures"] == ["Qwen3_5MoeForCausalLM"]
    again = models.ModelConfig.from_hf(json.loads(json.dumps(hf_cfg)))
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "layer_types", "partial_rotary_factor", "router_aux_loss_coef"):
        assert getattr(again, name) == getattr(ours.cfg, name), name
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        models.param_count(ours.cfg.replace(num_experts_per_tok=E + 1))


def _sft_batch(t=32, seed=5):
    """A packed SFT batch: two segments in row 0, padding at the end of row 1."""
    ids = np.random.default_rng(seed).integers(0, 128, (2, t)).astype(np.int32)
    seg = np.ones((2, t), np.int32)
    seg[0, t // 2 :] = 2
    seg[1, -5:] = 0
    pos = np.concatenate([np.arange(t // 2), np.arange(t - t // 2)])[None].repeat(2, 0).astype(np.int32)
    pos[1] = np.arange(t)
    w = (seg > 0).astype(np.float32)
    return {"input_ids": ids, "targets": np.roll(ids, -1, 1), "positions": pos, "segment_ids": seg, "loss_weights": w}


def test_sft_loss_includes_the_router_load_balancing_loss(hf, ours):
    """With router_aux_loss_coef > 0 the SFT loss is mean NLL + coef * the load-balancing loss over the
    real tokens (transformers' function as the reference); with 0 it is the NLL alone."""
    from mpa_jax.sft.loss import make_sft_loss

    b = {k: jnp.asarray(v) for k, v in _sft_batch().items()}
    cfg = ours.cfg
    # jitted: op-by-op dispatch of this MoE costs more than compiling it (make test time)
    s_aux, n = jax.jit(make_sft_loss(cfg, 64))(ours.params, b)
    s0, n0 = jax.jit(make_sft_loss(cfg.replace(router_aux_loss_coef=0.0), 64))(ours.params, b)
    assert float(n) == float(n0) == float(b["loss_weights"].sum())
    real = (b["segment_ids"] > 0).astype(jnp.int32)
    _, router = jax.jit(lambda p, *x: qwen3_5_moe.forward_with_aux(cfg, p, *x))(ours.params, b["input_ids"], b["positions"], b["segment_ids"], real)
    ref = float(load_balancing_loss_func(tuple(torch.tensor(np.asarray(r)) for r in router), E, K, torch.tensor(np.asarray(real))))
    assert ref > 0.5
    np.testing.assert_allclose(float(s_aux / n) - float(s0 / n0), cfg.router_aux_loss_coef * ref, rtol=2e-3)  # a difference of two ~5.0 losses
    # And it trains the router: its gradient changes with the coefficient.
    g = jax.jit(jax.grad(lambda p: make_sft_loss(cfg.replace(router_aux_loss_coef=1.0), 64)(p, b)[0]))(ours.params)
    g0 = jax.jit(jax.grad(lambda p: make_sft_loss(cfg.replace(router_aux_loss_coef=0.0), 64)(p, b)[0]))(ours.params)
    gate = lambda t: np.asarray(t["model"]["layers"]["0"]["mlp"]["gate"]["weight"])  # noqa: E731
    assert np.abs(gate(g) - gate(g0)).max() > 1e-3


def test_expert_parallel_sft_gradients_match_one_device(ours):
    """Experts over the `expert` mesh axis (8 devices; batch also split over it) give the loss and
    gradients of one device."""
    from mpa_jax.sft.loss import make_sft_loss

    cfg = ours.cfg
    loss = make_sft_loss(cfg, 64)
    b = _sft_batch(t=32)
    b = {k: np.concatenate([v] * 4) for k, v in b.items()}  # 8 rows
    want = jax.jit(jax.value_and_grad(lambda p, x: loss(p, x)[0]))(ours.params, {k: jnp.asarray(v) for k, v in b.items()})
    rules = tuple((k, ("data", "fsdp", "expert") if k == "batch" else v) for k, v in sharding.DEFAULT_RULES)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 1, "expert": 4})
    p_sh = sharding.param_shardings(cfg, mesh, rules)
    params = jax.device_put(ours.params, p_sh)
    assert params["model"]["layers"]["1"]["mlp"]["experts"]["down_proj"].sharding.spec[0] == "expert"
    x = jax.device_put({k: jnp.asarray(v) for k, v in b.items()}, sharding.batch_sharding(mesh, rules))
    assert x["input_ids"].sharding.spec[0] == ("fsdp", "expert")
    got = jax.jit(jax.value_and_grad(lambda p, x: loss(p, x)[0]), out_shardings=(None, p_sh))(params, x)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for a, c in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-3, atol=1e-5 * float(np.abs(c).max()))
