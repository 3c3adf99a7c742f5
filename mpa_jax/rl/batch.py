"""Rollouts -> packed RL rows: int token fields next to float per-token fields (advantage, behaviour log-prob).

A sequence of L tokens occupies L columns of a row; column t predicts token t+1, so its target,
loss weight, behaviour log-prob and advantage come from position t+1 (the first token is never a
target). Sequences are packed first-fit in the given order; each gets its own segment id and
positions from 0, so attention never crosses sequences and the packed loss equals the unpacked one.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from mpa_jax.rl.loss import FIELDS, FLOAT_FIELDS


@dataclasses.dataclass
class RLSequence:
    """One rollout as the learner sees it."""

    tokens: np.ndarray  # [L] int
    loss_mask: np.ndarray  # [L] 0/1: 1 on sampled tokens
    behaviour_logprobs: np.ndarray  # [L] float: the sampler's log-prob of each sampled token (0 elsewhere)
    advantage: float
    ref_logprobs: np.ndarray | None = None  # [L] float, when a KL reference is used


class BatchError(ValueError):
    """A rollout cannot become training data (a non-finite field); the message names the episode."""


def sequence_from_trajectory(traj, advantage: float, seq_len: int) -> tuple[RLSequence, bool]:
    """(sequence, truncated) of a Trajectory cut to `seq_len` tokens. A non-finite behaviour log-prob or
    advantage is a BatchError naming the episode: the runner ends such episodes as infra, so one here
    means rollouts from elsewhere (a file, a custom engine) that must not reach the update."""
    tokens = np.asarray(traj.tokens, np.int32)
    lps = np.asarray(traj.logprobs, np.float64)
    bad = np.flatnonzero(~np.isfinite(lps))
    where = f"episode of task {traj.task_id} (seed {traj.provenance.get('seed')}, weights {traj.provenance.get('weight_version')})"
    if bad.size:
        raise BatchError(f"{where}: the behaviour log-prob of token {int(bad[0])} is {lps[bad[0]]}; refusing to train on it")
    if not np.isfinite(advantage):
        raise BatchError(f"{where}: its advantage is {advantage}; refusing to train on it")
    truncated = tokens.shape[0] > seq_len
    return RLSequence(
        tokens=tokens[:seq_len],
        loss_mask=np.asarray(traj.loss_mask, np.float32)[:seq_len],
        behaviour_logprobs=lps.astype(np.float32)[:seq_len],
        advantage=float(advantage),
    ), truncated


def pack(seqs: Sequence[RLSequence], seq_len: int, *, min_rows: int = 1, row_multiple: int = 1,
         pow2_rows: bool = True) -> dict[str, np.ndarray]:
    """Pack sequences (each <= seq_len) into rows; the row count is padded to a power of two
    (fewer distinct shapes, fewer compilations) and to a multiple of `row_multiple`."""
    rows: list[list[RLSequence]] = []
    used: list[int] = []
    for s in seqs:
        n = int(s.tokens.shape[0])
        if n > seq_len:
            raise ValueError(f"pack: a sequence of {n} tokens does not fit rows of {seq_len}")
        for i, u in enumerate(used):
            if u + n <= seq_len:
                rows[i].append(s)
                used[i] += n
                break
        else:
            rows.append([s])
            used.append(n)
    n_rows = max(len(rows), int(min_rows), 1)
    if pow2_rows:
        n_rows = 1 << (n_rows - 1).bit_length()
    n_rows = -(-n_rows // row_multiple) * row_multiple
    out = {k: np.zeros((n_rows, seq_len), np.float32 if k in FLOAT_FIELDS else np.int32) for k in FIELDS}
    for r, row in enumerate(rows):
        at = 0
        for seg, s in enumerate(row, start=1):
            n = int(s.tokens.shape[0])
            sl, tl = slice(at, at + n), slice(at, at + n - 1)
            out["input_ids"][r, sl] = s.tokens
            out["segment_ids"][r, sl] = seg
            out["positions"][r, sl] = np.arange(n)
            out["targets"][r, tl] = s.tokens[1:]
            out["loss_weights"][r, tl] = s.loss_mask[1:]
            out["behaviour_logprobs"][r, tl] = s.behaviour_logprobs[1:]
            out["advantages"][r, tl] = s.advantage
            if s.ref_logprobs is not None:
                out["ref_logprobs"][r, tl] = s.ref_logprobs[1:]
            at += n
    return out


def minibatches(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split indices 0..n-1, shuffled by `rng`, into `k` near-equal parts (empty parts dropped)."""
    if k < 1:
        raise ValueError(f"minibatches must be >= 1, got {k}")
    perm = rng.permutation(n)
    return [p for p in np.array_split(perm, k) if len(p)]
