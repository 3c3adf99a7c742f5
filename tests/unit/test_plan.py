"""Per-size recipes and `mpa plan`: the recipes differ where sizes differ and share the rest; the plan
comes from the abstract build (nothing allocated) and its training bytes track the real peak of a
small compiled CPU step."""
import json
import os

import jax
import jax.numpy as jnp
import pytest

from mpa_jax import cli, models, sharding
from mpa_jax.config import load_config_file
from mpa_jax.sft import data as sft_data
from mpa_jax.sft import trainer
from mpa_jax.sft.synthetic import tiny_test_config
from mpa_jax.train import memory
from mpa_jax.train import optimizer as optlib
from mpa_jax.train import state as statelib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = ("qwen3_1_7b", "qwen3_8b", "qwen3_5_27b", "qwen3_5_35b_a3b")


def _load(name):
    return load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))


def test_recipes_set_their_own_training_settings():
    tiny = _load("tiny")
    cs = {n: _load(n) for n in SIZES}
    for n, c in cs.items():
        assert c.name == n
        assert c.sft.lr <= 2e-5 and c.sft.lr != tiny.sft.lr and c.sft.steps != tiny.sft.steps  # not the CPU demo's
        assert 0 < c.sft.warmup_steps < c.sft.steps // 10
        assert c.model.compute_dtype == "bfloat16" and c.model.param_dtype == "float32" and c.model.remat != "none"
        assert c.sft.seq_len >= 8192 and c.sft.batch_size >= 64 and c.mesh.fsdp == -1
        cfg = models.config_from_ml(c.model)  # every key a valid model field
        assert cfg.family.startswith("qwen3")
    assert len({c.sft.lr for c in cs.values()}) >= 3  # sizes differ where they should
    assert cs["qwen3_1_7b"].model.remat == "dots" and cs["qwen3_5_27b"].model.remat == "full"
    assert dict(cs["qwen3_5_35b_a3b"].sharding_rules)["batch"] == ("data", "fsdp", "expert")
    assert dict(cs["qwen3_8b"].sharding_rules)["batch"] == ("data", "fsdp")
    with pytest.raises(ValueError, match="unknown Qwen recipe"):
        import runpy

        runpy.run_path(os.path.join(ROOT, "configs", "qwen3_recipes.py"))["get_config"]("qwen3_70b")


def test_plan_cli_prints_bytes_flops_and_fits_without_allocating(tmp_path, capsys):
    # Hold the arrays alive before the call so their ids cannot be reused; arrays of earlier tests in this
    # worker may be collected meanwhile, so the check is "no new array", not "the same count".
    before = jax.live_arrays()
    rc = cli.main(["plan", "--config", os.path.join(ROOT, "configs", "qwen3_5_27b.py"), "--workdir", str(tmp_path),
                   "--devices", "64", "--config.mesh.tensor=2", "--json"])
    assert rc == 0
    p = json.loads(capsys.readouterr().out)
    known = {id(a) for a in before}
    assert [a.shape for a in jax.live_arrays() if id(a) not in known] == []  # nothing was allocated
    assert p["mesh"] == {"data": 1, "fsdp": 32, "tensor": 2, "expert": 1}
    assert 26.5e9 < p["param_count"] < 27.5e9
    assert abs(p["optimizer"] - 2 * p["params"]) < 2**20 and p["grads"] == p["params"]  # Adam: two moments (+ step counts)
    assert p["params"] < 4 * p["param_count"] / 50  # spread over 64 devices (norms replicated)
    assert p["activations"] > 0 and p["kv_cache"] > 0 and p["flops_per_step"] > 6 * p["param_count"] * 128 * 8192
    need = p["train_total"] + p["kv_cache"]  # the recipe's engine is sharded over the same devices
    assert p["fits"] == {k: need <= memory.FIT_FRACTION * cap for k, cap in memory.DEVICES.items()}
    assert p["fits"]["H200-141G"]
    rc = cli.main(["plan", "--config", os.path.join(ROOT, "configs", "qwen3_8b.py"), "--workdir", str(tmp_path), "--devices", "8"])
    out = capsys.readouterr().out
    assert rc == 0 and "activations" in out and "H100-80G" in out and "FLOPs per step" in out
    rc = cli.main(["plan", "--config", os.path.join(ROOT, "configs", "qwen3_8b.py"), "--workdir", str(tmp_path),
                   "--devices", "6", "--config.mesh.tensor=4"])
    assert rc == 2 and "does not divide 6 devices" in capsys.readouterr().err  # one line, exit 2


@pytest.mark.parametrize("remat", ["none", "dots"])
def test_plan_tracks_the_real_peak_of_a_small_cpu_step(remat):
    """Plan's train total (params + Adam + grads + activations) against XLA's memory analysis of the
    compiled step (arguments + temporaries) on 8 host devices: within a factor of 2 either way."""
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), vocab_size=512, seq_len=256, batch_size=16)
    c.model.hidden_size, c.model.intermediate_size, c.model.num_hidden_layers, c.model.remat = 64, 192, 4, remat
    c.mesh.data, c.mesh.fsdp = 2, 4
    p = memory.plan(c, 8)
    cfg, _ = models.run_model_config(c)
    mesh, rules = sharding.make_mesh(c.mesh), sharding.rules_from_config(c)
    step_fn, _ = trainer.compiled_steps(cfg, c.sft, int(c.model.logprob_chunk), mesh, rules)
    opt, _ = optlib.optimizer_from_config(c.sft)
    pshape = cfg.abstract_params()
    st = statelib.abstract_state(pshape, opt, statelib.state_shardings(mesh, pshape, sharding.param_shardings(cfg, mesh, rules), opt))
    row = sharding.batch_sharding(mesh, rules, 2)
    batch = {k: jax.ShapeDtypeStruct((16, 256), jnp.float32 if k == "loss_weights" else jnp.int32, sharding=row) for k in sft_data.FIELDS}
    ma = step_fn.lower(st, batch).compile().memory_analysis()
    real = ma.argument_size_in_bytes + ma.temp_size_in_bytes
    assert 0.5 < p["train_total"] / real < 2.0, (p, real)
