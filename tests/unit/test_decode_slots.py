"""Slot decoding (`models.prefill_slots` / `models.decode_slots`), every family: rows admitted at
different times into ring caches (the write column wrapping around), stepped together, retired and
reused, give at every step the full forward pass's logits of their own sequence."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax import models

QWEN3 = models.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, attention_bias=True, rope_theta=10_000.0)
QWEN35 = models.ModelConfig(family="qwen3_5", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.25,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            full_attention_interval=2, tie_word_embeddings=True, rope_theta=10_000.0)
MOE = QWEN35.replace(family="qwen3_5_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                     shared_expert_intermediate_size=24, expert_layout="fused")
CASES = {"qwen3": QWEN3, "qwen3_5": QWEN35, "qwen3_5_moe": MOE, "qwen3_5_scanned": QWEN35.replace(scan_layers=True)}

SLOTS, MAX_LEN, WIDTH = 4, 24, 8  # prompts left-padded to 8 columns; 24 ring columns, so the head wraps


class _Rows:
    """Host bookkeeping of the slot rows: what each holds, the ring head, and the logits to check."""

    def __init__(self, cfg, params, head: int) -> None:
        self.cfg, self.params, self.head = cfg, params, head
        self.state = models.init_slot_state(cfg, SLOTS, MAX_LEN)
        self.seq: dict[int, list[int]] = {}  # row -> prompt + tokens fed so far
        self.live = np.zeros((SLOTS,), bool)
        self.checks: list[tuple[int, int, np.ndarray]] = []  # (request, its tokens so far, logits after the last one)
        self.request: dict[int, int] = {}  # row -> request number
        self.requests: list[list[int]] = []  # each request's whole sequence
        self.prefill = jax.jit(lambda p, s, ids, m, rows, col: models.prefill_slots(cfg, p, s, ids, m, rows, col))
        self.step = jax.jit(lambda p, tok, pos, live, s, col: models.decode_slots(cfg, p, tok, pos, live, s, col))

    def admit(self, prompts: dict[int, list[int]]) -> None:
        n = 3  # every call the same shape (one compile); rows past the prompts are filler
        ids = np.zeros((n, WIDTH), np.int32)
        mask = np.zeros((n, WIDTH), np.int32)
        mask[:, -1] = 1  # filler rows: one real token
        rows = np.full((n,), SLOTS, np.int32)  # out of range: dropped
        for j, (row, p) in enumerate(prompts.items()):
            ids[j, WIDTH - len(p):] = p
            mask[j, WIDTH - len(p):] = 1
            rows[j] = row
        logits, self.state = self.prefill(self.params, self.state, ids, mask, rows, jnp.int32(self.head))
        for j, (row, p) in enumerate(prompts.items()):
            self.seq[row] = list(p)
            self.request[row] = len(self.requests)
            self.requests.append(self.seq[row])
            self.live[row] = True
            self.checks.append((self.request[row], len(p), np.asarray(logits[j])))

    def run(self, steps: int, rng: np.random.Generator, stop_after: dict[int, int] | None = None) -> None:
        stop_after = dict(stop_after or {})
        for k in range(steps):
            tok = rng.integers(1, self.cfg.vocab_size, SLOTS).astype(np.int32)
            pos = np.array([len(self.seq.get(r, [])) for r in range(SLOTS)], np.int32)
            live = self.live.copy()
            logits, self.state = self.step(self.params, tok, pos, live, self.state, jnp.int32(self.head))
            self.head = (self.head + 1) % MAX_LEN
            for r in np.flatnonzero(live):
                self.seq[r].append(int(tok[r]))
                self.checks.append((self.request[r], len(self.seq[r]), np.asarray(logits[r])))
                if stop_after.get(int(r)) == k + 1:
                    self.live[r] = False  # retired: its row rides along masked until reused


@pytest.mark.parametrize("name", sorted(CASES))
def test_slot_rows_at_different_positions_equal_the_full_forward(name):
    cfg = CASES[name]
    # Scaled so that logits are far from uniform (a wrong cache column would show).
    params = jax.tree.map(lambda x: 3.0 * x + 0.01, models.init_params(cfg, jax.random.key(3)))
    rows = _Rows(cfg, models.decode_params(cfg, params), head=15)
    rng = np.random.default_rng(0)
    prompt = lambda n: rng.integers(1, cfg.vocab_size, n).tolist()  # noqa: E731
    rows.admit({1: prompt(5)})  # alone first
    rows.run(3, rng)
    rows.admit({3: prompt(7), 0: prompt(2)})  # two more at a later head (and a filler row, dropped)
    rows.run(6, rng, stop_after={0: 2})  # row 0 ends after 2 tokens and stays masked
    rows.admit({0: prompt(8)})  # row 0 reused: nothing of its old request may leak (caches and DeltaNet state)
    rows.run(7, rng)
    assert rows.head < 15  # the write column wrapped around the ring
    assert len(rows.checks) == 4 + 3 + (6 * 2 + 2) + 7 * 3
    # One forward pass over every request's whole sequence (right-padded: causal, so a prefix's logits
    # are those of the prefix alone).
    ids = np.zeros((len(rows.requests), MAX_LEN + WIDTH), np.int32)
    for i, seq in enumerate(rows.requests):
        ids[i, : len(seq)] = seq
    ref = np.asarray(jax.jit(lambda p, x: models.forward(cfg, p, x))(params, ids))
    worst = 0.0
    for req, n, got in rows.checks:
        want = ref[req, n - 1]
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    assert worst < 1e-4, worst


def test_every_family_implements_slot_decoding():
    for family in models.registry.FAMILIES:
        module = models.registry.family_module(family)  # raises when a required function is missing
        assert callable(module.decode_slots) and callable(module.slot_cache_axes)
    axes = models.slot_cache_axes(QWEN35)
    assert axes["0"] == {"conv": None, "recurrent": None} and axes["1"] == {"k": 1, "v": 1}
    state = jax.eval_shape(lambda: models.init_slot_state(QWEN35, 3, 10))
    assert sorted(state) == ["kv_mask", "layers"] and state["layers"]["1"]["k"].shape[1] == 10
