"""Released Qwen3.5 shapes: the configs build abstractly (nothing allocated) to ~27B and ~35B-A3B
parameters, and a mesh spreads the parameter bytes over its devices."""
import importlib.util
import os

import pytest

from mpa_jax import models, sharding
from mpa_jax.models import qwen3_5

CONFIGS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "configs")


def load(name):
    spec = importlib.util.spec_from_file_location(f"_cfg_{name}", os.path.join(CONFIGS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize(
    "name, total, active, mesh, slack",
    [
        ("qwen3_5_27b", (26.5e9, 27.5e9), (26.5e9, 27.5e9), {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}, 1.05),
        # Experts split 8 ways (expert x fsdp); the ~2.5B non-expert weights only over fsdp=2.
        ("qwen3_5_35b_a3b", (34e9, 36e9), (3e9, 4e9), {"data": 1, "fsdp": 2, "tensor": 1, "expert": 4}, 1.25),
    ],
)
def test_abstract_build_counts_and_per_device_bytes(name, total, active, mesh, slack):
    config = load(name)
    cfg = models.config_from_ml(config.model)
    assert cfg.family in ("qwen3_5", "qwen3_5_moe")
    report = qwen3_5.param_report(cfg, sharding.make_mesh(mesh), sharding.rules_from_config(config))
    assert total[0] < report["total_params"] < total[1]
    assert active[0] < report["active_params"] < active[1]
    assert report["param_bytes"] == 4 * report["total_params"]  # float32 master weights
    # Eight devices hold about an eighth each (what is not split over every axis is replicated).
    share = report["param_bytes"] / 8
    assert share <= report["max_param_bytes_per_device"] < slack * share
