"""Meshes from config, logical-axis rules, sharded forward == single device, abstract 8B build."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from mpa_jax import models, sharding
from mpa_jax.config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = models.ModelConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, rope_theta=10_000.0,
)


def test_make_mesh_from_config_fills_minus_one():
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    tiny = load_config_file(os.path.join(ROOT, "configs", "tiny.py"))
    mesh = sharding.make_mesh(tiny.mesh)
    assert mesh.axis_names == ("data", "fsdp", "tensor", "expert")
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
    mesh = sharding.make_mesh({"data": 2, "fsdp": -1, "tensor": 2, "expert": 1})
    assert mesh.shape["fsdp"] == 2
    with pytest.raises(ValueError, match="at most one axis"):
        sharding.make_mesh({"data": -1, "fsdp": -1, "tensor": 1, "expert": 1})
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh((4, 4, 1, 1))
    with pytest.raises(ValueError, match="lacks axis 'expert'"):
        sharding.make_mesh({"data": 8, "fsdp": 1, "tensor": 1})


def test_logical_to_spec_follows_rules():
    rules = load_config_file(os.path.join(ROOT, "configs", "tiny.py")).sharding_rules
    # fsdp is used by batch first, so embed falls back to replicated: a mesh axis is used once per array.
    assert sharding.logical_to_spec(("batch", "length", "embed"), rules) == P(("data", "fsdp"), None, None)
    assert sharding.logical_to_spec(("embed", "heads"), rules) == P("fsdp", "tensor")
    assert sharding.logical_to_spec(("vocab", "embed"), rules) == P("tensor", "fsdp")
    assert sharding.logical_to_spec(("norm",), rules) == P(None)
    mesh = sharding.make_mesh((2, 2, 2, 1))
    # 3 is not divisible by tensor=2: replicated instead of failing
    assert sharding.logical_to_spec(("embed", "heads"), rules, mesh, (64, 3)) == P("fsdp", None)
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        sharding.logical_to_spec(("embed",), (("embed", "model"),))


@pytest.fixture(scope="module")
def reference():
    params = models.init_params(CFG, jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (8, 16), 0, CFG.vocab_size)
    mask = jnp.ones((8, 16), jnp.int32).at[:3, :5].set(0)  # left padding in some rows
    fwd = jax.jit(lambda p, i, m: models.forward(CFG, p, i, attention_mask=m))
    return params, ids, mask, np.asarray(fwd(params, ids, mask))


@pytest.mark.parametrize("shape", [(8, 1, 1, 1), (2, 2, 2, 1), (1, 4, 2, 1)])
def test_sharded_forward_equals_single_device(reference, shape):
    params1, ids, mask, want = reference
    mesh = sharding.make_mesh(shape)
    rules = sharding.DEFAULT_RULES
    params = models.init_params(CFG, jax.random.key(0), mesh=mesh, rules=rules)
    expected = sharding.param_shardings(CFG, mesh, rules)
    for got, w in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        assert got.sharding.is_equivalent_to(w, got.ndim)
    # created sharded with the same values as the unsharded init
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    batch = sharding.shard_batch({"ids": ids, "mask": mask}, mesh, rules)
    fwd = jax.jit(lambda p, b: models.forward(CFG, p, b["ids"], attention_mask=b["mask"]))
    got = np.asarray(fwd(params, batch))
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_parameter_shardings_are_what_rules_say():
    mesh = sharding.make_mesh((2, 2, 2, 1))
    sh = sharding.param_shardings(CFG, mesh, sharding.DEFAULT_RULES)
    layer = sh["model"]["layers"]["1"]
    assert layer["self_attn"]["q_proj"]["kernel"].spec == P("fsdp", "tensor")
    assert layer["self_attn"]["k_proj"]["kernel"].spec == P("fsdp", "tensor")
    assert layer["self_attn"]["o_proj"]["kernel"].spec == P("tensor", "fsdp")
    assert layer["mlp"]["down_proj"]["kernel"].spec == P("tensor", "fsdp")
    assert layer["self_attn"]["q_norm"]["weight"].spec == P(None)
    assert sh["model"]["embed_tokens"]["weight"].spec == P("tensor", "fsdp")
    assert sh["lm_head"]["kernel"].spec == P("fsdp", "tensor")
    # pure data parallel: everything replicated
    sh8 = sharding.param_shardings(CFG, sharding.make_mesh((8, 1, 1, 1)), sharding.DEFAULT_RULES)
    assert all(s.is_fully_replicated for s in jax.tree.leaves(sh8))
    assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp"), None)


def test_qwen3_8b_builds_abstractly_with_right_count_and_bytes():
    config = load_config_file(os.path.join(ROOT, "configs", "qwen3_8b.py"))
    cfg = models.config_from_ml(config.model)
    assert models.param_count(cfg) == 8_190_735_360  # Qwen3-8B
    mesh = sharding.make_mesh((1, 4, 2, 1))
    shapes = jax.eval_shape(lambda r: models.registry.family_module(cfg.family).init_params(cfg, r), jax.random.key(0))
    shard = sharding.param_shardings(cfg, mesh, sharding.rules_from_config(config))
    per_device = sharding.per_device_bytes(shapes, shard)
    norm_params = 36 * (2 * 4096 + 2 * 128) + 4096  # replicated (no rule for norm / head_dim)
    want = (8_190_735_360 - norm_params) * 4 // 8 + norm_params * 4
    assert set(per_device.values()) == {want}
    assert len(per_device) == 8
    tiny17 = models.config_from_ml(load_config_file(os.path.join(ROOT, "configs", "qwen3_1_7b.py")).model)
    assert models.param_count(tiny17) == 1_720_574_976  # Qwen3-1.7B: 1.41B non-embedding + 311M tied embedding


def test_sharded_bfloat16_gradients_match_single_device():
    """bfloat16 compute on CPU takes `layers.matmul_f32`'s hand-written backward with layout
    constraints; sharded, its gradients are as close to the float32 ones as one device's are (they
    differ from one device's by bfloat16 rounding in other summation orders)."""
    bf = CFG.replace(compute_dtype="bfloat16")
    ids = jax.random.randint(jax.random.key(2), (8, 16), 0, CFG.vocab_size)

    def loss(c):
        return jax.jit(jax.grad(lambda p, i: jnp.mean(jax.nn.logsumexp(models.forward(c, p, i), axis=-1))))

    def worst(got, want):
        return max(float(jnp.abs(a - b).max() / jnp.abs(b).max()) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))

    params = models.init_params(bf, jax.random.key(0))
    ref = loss(CFG)(params, ids)
    single = worst(loss(bf)(params, ids), ref)
    mesh = sharding.make_mesh((2, 2, 2, 1))
    sparams = models.init_params(bf, jax.random.key(0), mesh=mesh, rules=sharding.DEFAULT_RULES)
    sharded = worst(loss(bf)(sparams, sharding.shard_batch({"ids": ids}, mesh)["ids"]), ref)
    assert single < 0.1 and sharded < max(2 * single, 2e-2), (single, sharded)
