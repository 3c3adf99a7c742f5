"""Qwen3.5-35B-A3B shapes (MoE hybrid: 256 routed experts, top-8, plus a gated shared expert) on the
tiny config's settings; set model.init_from to an HF directory to load the released weights.

`python configs/qwen3_5_35b_a3b.py` prints the abstract build: parameter counts and per-device bytes.
"""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny.py"))
    c.name = "qwen3_5_35b_a3b"
    m = c.model
    m.family = "qwen3_5_moe"
    m.vocab_size = 248320
    m.hidden_size = 2048
    m.intermediate_size = 512  # unused by MoE layers; kept equal to the expert width
    m.num_hidden_layers = 40
    m.num_attention_heads = 16
    m.num_key_value_heads = 2
    m.head_dim = 256
    m.full_attention_interval = 4
    m.partial_rotary_factor = 0.25
    m.linear_conv_kernel_dim = 4
    m.linear_key_head_dim = 128
    m.linear_value_head_dim = 128
    m.linear_num_key_heads = 16
    m.linear_num_value_heads = 32
    m.num_experts = 256
    m.num_experts_per_tok = 8
    m.moe_intermediate_size = 512
    m.shared_expert_intermediate_size = 512
    m.router_aux_loss_coef = 0.001
    m.rope_theta = 10_000_000.0
    m.rms_norm_eps = 1e-6
    m.tie_word_embeddings = False
    m.max_position_embeddings = 262144
    m.param_dtype = "float32"
    m.compute_dtype = "bfloat16"
    m.remat = "full"
    m.logprob_chunk = 8192
    m.delta_impl = "pallas"  # GPU/TPU; use "jnp" on CPU
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    c.mesh.expert = 1
    c.tokenizer.vocab_size = 248320
    return c


if __name__ == "__main__":
    from mpa_jax import models
    from mpa_jax.models import qwen3_5

    print(qwen3_5.param_report(models.config_from_ml(get_config().model)))
