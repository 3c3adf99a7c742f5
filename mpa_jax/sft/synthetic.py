"""Synthetic Trajectories with a learnable structure, for tests and benchmarks (no tokenizer, no env).

Each trajectory alternates "prompt" spans (random tokens, mask 0) and "reply" spans (mask 1) in which
each token is a fixed function of the previous one, so a model can push the loss far below unigram.
"""
from __future__ import annotations

import numpy as np

from mpa_jax.envs.contract import Trajectory, write_jsonl


def make_trajectories(n: int, vocab_size: int, *, min_len: int = 8, max_len: int = 48, seed: int = 0) -> list[Trajectory]:
    """`n` Trajectories of lengths in [min_len, max_len] over token ids [0, vocab_size)."""
    rng = np.random.default_rng(seed)
    step = 7 % vocab_size or 1
    out = []
    for i in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        tokens, mask = [], []
        while len(tokens) < length:
            p = int(rng.integers(1, 5))
            tokens += [int(t) for t in rng.integers(0, vocab_size, size=p)]
            mask += [0] * p
            r = int(rng.integers(2, 9))
            for _ in range(r):
                tokens.append((tokens[-1] * 3 + step) % vocab_size)
                mask.append(1)
        tokens, mask = tokens[:length], mask[:length]
        out.append(Trajectory(task_id=f"synthetic-{i}", tokens=tokens, loss_mask=mask, logprobs=[0.0] * length, steps=[],
                              provenance={"planner": "synthetic"}))
    return out


def write_trajectories(path: str, n: int, vocab_size: int, **kwargs) -> str:
    """Write `make_trajectories(...)` as JSONL to `path`; returns path."""
    write_jsonl(path, make_trajectories(n, vocab_size, **kwargs))
    return path


def tiny_test_config(config, *, vocab_size: int = 256, seq_len: int = 64, batch_size: int = 8, steps: int = 8, layers: int = 1):
    """Shrink an experiment config (in place) to a model and batch that compile and run in seconds on CPU."""
    m = config.model
    m.vocab_size, m.hidden_size, m.intermediate_size = vocab_size, 32, 64
    m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, m.head_dim = layers, 2, 1, 16
    m.logprob_chunk = 128
    s = config.sft
    s.seq_len, s.batch_size, s.steps, s.warmup_steps, s.log_every = seq_len, batch_size, steps, 2, 1
    s.eval_every, s.eval_fraction, s.only_success = 0, 0.0, False  # synthetic data has no verification
    config.checkpoint.every = max(1, steps // 2)
    return config
