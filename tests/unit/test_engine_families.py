"""The one engine runs every model family in its slots: Qwen3.5 hybrid (DeltaNet recurrent state +
attention caches) and Qwen3.5-MoE give the tokens and log-probs of `generate_batch` (the cache off) through `submit`,
over one device and over two replicas, with rows admitted as slots free up."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from mpa_jax import models
from mpa_jax.rollout.jax_engine import Engine
from mpa_jax.rollout.slots import slot_support
from mpa_jax.rollout.types import SamplingParams

QWEN35 = models.ModelConfig(family="qwen3_5", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.25,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            full_attention_interval=2, tie_word_embeddings=True, max_position_embeddings=512)
MOE = QWEN35.replace(family="qwen3_5_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                     shared_expert_intermediate_size=24, expert_layout="fused")


@pytest.mark.parametrize("cfg", [QWEN35, MOE], ids=["qwen3_5", "qwen3_5_moe"])
def test_family_in_slots_equals_the_whole_batch_program(cfg):
    assert jax.local_device_count() >= 2, "needs 2 host devices (tests/conftest.py sets 8)"
    params = jax.tree.map(lambda x: 3.0 * x, models.init_params(cfg, jax.random.key(1)))  # peaked logits
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in (5, 19, 9)]
    rows = [SamplingParams(max_new_tokens=14, temperature=0.0), SamplingParams(max_new_tokens=20, temperature=1.0),
            SamplingParams(max_new_tokens=9, temperature=0.8, top_k=5, stop_token_ids=(7,))]
    for replicas in ((1, 2) if cfg.family == "qwen3_5" else (2,)):  # MoE: its experts are what is new
        engine = Engine(cfg, params, slots=2, slot_len=64, chunk=4, replicas=replicas, max_batch=4)
        assert slot_support(engine) is None
        got = [f.result(300) for f in [engine.submit(p, sp, seed=i) for i, (p, sp) in enumerate(zip(prompts, rows))]]
        want = engine.generate_batch(prompts, rows, [0, 1, 2])
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
        stats = engine.stats()
        # all six rows (three submitted, three of the reference) ran in the slots, two at a time
        assert stats["admitted"] == 6 and stats["fallback_rows"] == 0
        engine.close()
