"""The starter planner's recipe: a small Qwen3-shaped model trained from scratch by `mpa sft` on
train-split oracle demonstrations only, in the compact context (docs/learning.md has the measurements).

Rebuild the shipped checkpoint (starter/) with one command:

    python -m mpa_jax.sft.starter --out starter        # = mpa sft + export + held-out eval + datasheet

The demo (`make demo`, configs/tiny.py) starts from the shipped starter.
"""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny.py"))
    c.name = "starter"

    c.context.format = "compact"  # one-line tool signatures: ~410 instead of ~1,310 tokens per episode
    c.context.reasoning = "none"  # no <think> sentences: the next action already says what they say

    c.model.hidden_size = 256
    c.model.intermediate_size = 768
    c.model.num_hidden_layers = 4  # copying names and ids from the request needs >= 2 attention layers
    c.model.num_attention_heads = 8
    c.model.num_key_value_heads = 4
    c.model.head_dim = 32
    c.model.max_position_embeddings = 2048
    c.model.compute_dtype = "bfloat16"  # AMX bf16 matmuls on this CPU (docs/perf.md); float32 master weights

    c.tasks.per_template = 24  # train instances per template (x weight): ~12.5k tasks; copying needs many instances
    c.oracle.max_tasks = 0  # every train task
    c.oracle.variants = 1

    c.sft.seq_len = 1024  # compact episodes are ~410 tokens (max ~900)
    c.sft.batch_size = 8
    c.sft.steps = 3000
    c.sft.lr = 2e-3
    c.sft.warmup_steps = 30
    c.sft.eval_every = 300
    c.sft.log_every = 25
    c.sft.eval_fraction = 0.02
    c.sft.export = True

    c.checkpoint.every = 100
    c.rollout.max_total_tokens = 2048
    return c
