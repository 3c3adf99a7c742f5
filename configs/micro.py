"""Micro config: the closed loop end to end in well under a minute on CPU (tests of `mpa loop`)."""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny.py"))
    c.name = "micro"
    c.model.vocab_size = 512
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.num_hidden_layers = 1
    c.model.num_attention_heads = 2
    c.model.num_key_value_heads = 1
    c.model.head_dim = 16
    c.model.logprob_chunk = 256
    c.tokenizer.vocab_size = 512
    c.tokenizer.corpus_tasks = 0
    c.oracle.max_tasks = 10
    c.sft.seq_len = 4096  # the 512-id BPE makes ~2k-token episodes
    c.sft.batch_size = 8
    c.sft.steps = 2
    c.sft.warmup_steps = 1
    c.sft.log_every = 1
    c.sft.eval_every = 0
    c.sft.eval_fraction = 0.0
    c.checkpoint.every = 1  # every step: a kill lands between checkpoints
    c.checkpoint.async_save = False
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 8
    c.rollout.batch_size = 4
    c.rollout.replicas = 1
    c.data.tasks_per_round = 6
    c.data.max_tokens = 4096
    c.data.policy_tasks = 2
    c.eval.max_tasks = 4  # stratified: 4 domains and 4 of the 5 categories (test split); small on purpose (test_loop pins 4)
    c.loop.eval_split = ""  # config.eval.split (test), eval.max_tasks stratified tasks
    c.loop.eval_seen = 0
    c.loop.eval_held_out = 0
    c.loop.rounds = 2
    c.loop.starter = ""  # from scratch: the shipped starter has another shape (and takes minutes)
    c.loop.rl_steps = 1
    c.rl.group_size = 2
    c.rl.tasks_per_step = 2
    c.rl.seq_len = 4096  # = rollout.max_total_tokens (the 512-id BPE makes long episodes)
    c.loop.refresh_steps = 2  # = sft.steps and the same lr: the refresh reuses the cold start's compiled step
    c.loop.refresh_lr = c.sft.lr
    c.loop.release_gate_tasks = 4  # the release gate runs (on 4 train tasks) in the loop tests
    return c
