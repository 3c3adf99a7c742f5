"""The prefix cache's host index: which tokens each slot row holds, and the best reuse for a prompt.

Every slot row holds the keys/values (and, for the hybrid families, the DeltaNet state) of a token
sequence from column 0: a running request's prompt and tokens so far, or, after it ended, what it held
then (kept until the row is given to another request). A new prompt reuses the longest prefix any row
of its replica holds (SGLang's radix cache keeps a tree of shared prefixes over a paged pool; here a
row is one path of that tree and the index compares the prompt with each row, which at tens of rows
costs microseconds next to a prefill):

- attention-only families: any common prefix (a row's first k tokens are exactly the keys/values of
  those k tokens);
- families with a recurrent state (Qwen3.5 DeltaNet): only a row's whole content, since its state is
  that of all it holds: the next turn of an episode (which starts with everything the turn before held),
  or a group's shared prompt (copied from the row that prefilled it, logits included).

At least one prompt token is always computed unless a row holds exactly the prompt with its next-token
logits (a group's other samples). Entries are valid for one weight generation: `invalidate()` (a
weight update) drops them all, and a row that was running across an update never becomes reusable.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PrefixIndex"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixIndex:
    """Per slot: the tokens it holds (`held`), whether its logits are those after them (`ready`), the
    weight generation they belong to, and when it was last used (for eviction)."""

    def __init__(self, slots: int, recurrent: bool) -> None:
        self.recurrent = bool(recurrent)
        self.gen = 0
        self.held = [np.zeros((0,), np.int32) for _ in range(slots)]
        self.ready = [False] * slots
        self.row_gen = [-1] * slots
        self.used = [0] * slots
        self.clock = 0

    def invalidate(self) -> None:
        """New weights: nothing held so far may be reused. The eviction clock restarts too, so which slot a
        request gets after a weight update does not depend on what ran before it (an RL run resumed from a
        checkpoint places its rows, hence shapes its programs, exactly as the uninterrupted run did)."""
        self.gen += 1
        self.used = [0] * len(self.used)
        self.clock = 0

    def valid(self, s: int) -> bool:
        return self.row_gen[s] == self.gen and len(self.held[s]) > 0

    def set(self, s: int, tokens: list[int] | np.ndarray, ready: bool, gen: int | None = None) -> None:
        """Slot `s` now holds `tokens` (of weight generation `gen`, default the current one)."""
        self.held[s] = np.asarray(tokens, np.int32)
        self.ready[s] = bool(ready)
        self.row_gen[s] = self.gen if gen is None else gen
        self.clock += 1
        self.used[s] = self.clock

    def clear(self, s: int) -> None:
        self.held[s] = np.zeros((0,), np.int32)
        self.ready[s] = False
        self.row_gen[s] = -1

    def usable(self, held: np.ndarray, ready: bool, prompt: np.ndarray) -> int:
        """Tokens of `prompt` a row holding `held` (logits after it when `ready`) can spare computing."""
        m = common_prefix(held, prompt)
        if m == len(prompt) and m == len(held) and ready:
            return m  # exactly the prompt with its logits: nothing to compute
        m = min(m, len(prompt) - 1)  # the last prompt token is computed for its logits
        if self.recurrent and m < len(held):
            return 0  # a recurrent state exists only at the end of what a row holds
        return max(m, 0)

    def match(self, s: int, prompt: np.ndarray) -> int:
        """`usable` for what slot `s` holds (0 when it holds nothing valid)."""
        if not self.valid(s):
            return 0
        return self.usable(self.held[s], self.ready[s], prompt)
