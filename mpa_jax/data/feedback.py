"""Competence feedback: what training and evaluation reveal sets the next round's generation weights.

Competence of a cell is its smoothed success rate, c = (s + 1) / (n + 2). Cells where the policy is
neither hopeless nor already perfect carry the most learning signal (GRPO groups with mixed outcomes),
so the weight is w = floor + 4 c (1 - c): 1 at c = 0.5, `floor` at c = 0 or 1. Cells never measured
get the prior c = 0.5 (explore them). CARE's own EMA competence (a cell -> value mapping) can be passed
in instead of counts.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping

from mpa_jax.data.keys import key_of_trajectory


def competence_from_trajectories(trajectories: Iterable[Any]) -> dict[str, dict[str, float]]:
    """Per cell: {"n", "success", "competence"} over scored (non-infra) trajectories."""
    tally: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in trajectories:
        if t.infra_failure or t.verification is None:
            continue
        k = key_of_trajectory(t)
        tally[k][0] += int(bool(t.verification.success))
        tally[k][1] += 1
    return {k: {"n": float(n), "success": float(s), "competence": (s + 1.0) / (n + 2.0)} for k, (s, n) in sorted(tally.items())}


def generation_weights(competence: Mapping[str, Any], keys: Iterable[str], floor: float = 0.05) -> dict[str, float]:
    """Normalised generation weights over `keys` from per-cell competence (a float, or a dict with
    "competence"). Unmeasured cells get the prior 0.5."""
    w = {}
    for k in keys:
        c = competence.get(k)
        if isinstance(c, Mapping):
            c = c.get("competence")
        c = 0.5 if c is None else min(1.0, max(0.0, float(c)))
        w[k] = floor + 4.0 * c * (1.0 - c)
    z = sum(w.values())
    if z <= 0:
        raise ValueError("generation_weights: no cells")
    return {k: v / z for k, v in sorted(w.items())}
