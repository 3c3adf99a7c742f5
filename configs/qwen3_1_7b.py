"""Qwen3-1.7B shapes (tied embeddings) on the tiny config's settings; set model.init_from to an HF dir to load weights."""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny.py"))
    c.name = "qwen3_1_7b"
    m = c.model
    m.family = "qwen3"
    m.vocab_size = 151936
    m.hidden_size = 2048
    m.intermediate_size = 6144
    m.num_hidden_layers = 28
    m.num_attention_heads = 16
    m.num_key_value_heads = 8
    m.head_dim = 128
    m.rope_theta = 1_000_000.0
    m.rms_norm_eps = 1e-6
    m.tie_word_embeddings = True
    m.max_position_embeddings = 40960
    m.param_dtype = "float32"
    m.compute_dtype = "bfloat16"
    m.remat = "full"
    m.logprob_chunk = 8192
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    c.tokenizer.vocab_size = 151936
    return c
