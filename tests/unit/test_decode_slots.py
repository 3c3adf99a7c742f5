"""Slot decoding and the prefix cache at the model level (`models.extend_slots`, `place_slots`,
`decode_slots`), every family: rows admitted in chunks, stepped together at their own columns, retired
(their tokens kept), continued by a next turn, shared with another row (a copied prefix, for the hybrid
family only whole: its DeltaNet state is that of all a row holds) and cut back, give at every step the
full forward pass's logits of their own sequence."""
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

SLOTS, COLS, CHUNK = 4, 40, 4  # chunks of 4 tokens: prompts of 5..9 tokens take two or three calls


class _Rows:
    """Host bookkeeping of the slot rows: what each holds and the logits to check."""

    def __init__(self, cfg, params) -> None:
        self.cfg, self.params = cfg, params
        self.state = models.init_slot_state(cfg, SLOTS, COLS)
        self.seq: dict[int, list[int]] = {}  # row -> the tokens whose keys/values it holds
        self.live = np.zeros((SLOTS,), bool)
        self.pending: dict[int, int] = {}  # row -> its last sampled token, not yet fed (live rows)
        self.checks: list[tuple[list[int], np.ndarray]] = []  # (sequence, logits after its last token)
        self.extend = jax.jit(lambda p, s, ids, n, rows, starts: models.extend_slots(cfg, p, s, ids, n, rows, starts))
        self.place = jax.jit(lambda s, src, dst, keep: models.place_slots(cfg, s, src, dst, keep))
        self.step = jax.jit(lambda p, tok, pos, live, s: models.decode_slots(cfg, p, tok, pos, live, s, pos))

    def place_rows(self, moves: list[tuple[int, int, int]]) -> None:
        src, dst, keep = (np.full((3,), v, np.int32) for v in (0, SLOTS, 0))  # filler: dropped
        for j, (a, b, k) in enumerate(moves):
            src[j], dst[j], keep[j] = a, b, k
        self.state = self.place(self.state, src, dst, keep)
        seqs = {b: list(self.seq.get(a, []))[:k] for a, b, k in moves}
        self.seq.update(seqs)

    def feed(self, new: dict[int, list[int]]) -> None:
        """Continue rows by their new tokens, CHUNK at a time; each ends live with its logits checked."""
        new = {r: list(t) for r, t in new.items()}
        while any(new.values()):
            ids = np.zeros((3, CHUNK), np.int32)
            n, rows, starts = np.zeros((3,), np.int32), np.full((3,), SLOTS, np.int32), np.zeros((3,), np.int32)
            part = [(r, t[:CHUNK]) for r, t in new.items() if t]
            for j, (r, toks) in enumerate(part):
                ids[j, : len(toks)] = toks
                n[j], rows[j], starts[j] = len(toks), r, len(self.seq[r])
            logits, self.state = self.extend(self.params, self.state, ids, n, rows, starts)
            for j, (r, toks) in enumerate(part):
                self.seq[r] += toks
                new[r] = new[r][len(toks):]
                if not new[r]:
                    self.checks.append((list(self.seq[r]), np.asarray(logits[j])))
                    self.live[r] = True

    def run(self, steps: int, rng: np.random.Generator, stop_after: dict[int, int] | None = None) -> None:
        stop_after = dict(stop_after or {})
        for k in range(steps):
            tok = rng.integers(1, self.cfg.vocab_size, SLOTS).astype(np.int32)
            pos = np.array([len(self.seq.get(r, [])) for r in range(SLOTS)], np.int32)
            live = self.live.copy()
            logits, self.state = self.step(self.params, tok, pos, live, self.state)
            for r in np.flatnonzero(live):
                self.seq[r].append(int(tok[r]))
                self.checks.append((list(self.seq[r]), np.asarray(logits[r])))
                if stop_after.get(int(r)) == k + 1:
                    self.live[r] = False  # retired: it keeps what it holds for a next turn


@pytest.mark.parametrize("name", sorted(CASES))
def test_slot_rows_continued_shared_and_cut_equal_the_full_forward(name):
    cfg = CASES[name]
    hybrid = cfg.family != "qwen3"
    # Scaled so that logits are far from uniform (a wrong cache column would show).
    params = jax.tree.map(lambda x: 3.0 * x + 0.01, models.init_params(cfg, jax.random.key(3)))
    rows = _Rows(cfg, models.decode_params(cfg, params))
    rng = np.random.default_rng(0)
    prompt = lambda n: rng.integers(1, cfg.vocab_size, n).tolist()  # noqa: E731
    rows.place_rows([(1, 1, 0)])
    rows.feed({1: prompt(5)})  # alone first, two chunks
    rows.run(3, rng)
    rows.place_rows([(3, 3, 0), (0, 0, 0)])
    rows.feed({3: prompt(9), 0: prompt(2)})  # two more, three chunks and one
    rows.run(6, rng, stop_after={0: 2, 1: 4})  # rows 0 and 1 end and keep their tokens
    held0 = len(rows.seq[0])
    rows.feed({0: prompt(6)})  # row 0's next turn: only its new tokens are computed
    # Row 2 shares row 1's tokens (a group's shared prompt / a common prefix): whole for the hybrid
    # families, a prefix for attention-only models. Row 1 is cut back to a prefix (attention only).
    keep = len(rows.seq[1]) if hybrid else 4
    moves = [(1, 2, keep)] + ([] if hybrid else [(1, 1, 3)])
    rows.place_rows(moves)
    rows.feed({2: prompt(3), **({} if hybrid else {1: prompt(2)})})
    rows.run(5, rng)
    assert held0 > 0 and len(rows.checks) > 20
    # One forward pass over every checked sequence (right-padded: causal, so a prefix's logits are
    # those of the prefix alone).
    seqs = {tuple(s) for s, _ in rows.checks}
    longest = max(len(s) for s in seqs)
    order = sorted(seqs)
    ids = np.zeros((len(order), longest), np.int32)
    for i, seq in enumerate(order):
        ids[i, : len(seq)] = seq
    ref = np.asarray(jax.jit(lambda p, x: models.forward(cfg, p, x))(params, ids))
    at = {s: i for i, s in enumerate(order)}
    worst = 0.0
    for seq, got in rows.checks:
        want = ref[at[tuple(seq)], len(seq) - 1]
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
