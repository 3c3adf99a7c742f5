"""The hybrid mixture: episodes drawn across env kinds (`envs.base.ENV_KINDS`) by configured weights.

`MixtureSampler(weights, tasks_by_kind, seed).sample(n)` gives a seeded list of (kind, task) draws: the
kind by weight, then the kind's tasks in a shuffled cycle. Episodes themselves run through the one runner
(`rollout.runner.EpisodeRunner`, with `kinds=`), the mixture test's included.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from mpa_jax.envs.base import ENV_KINDS
from mpa_jax.envs.contract import Task


class MixtureSampler:
    """Seeded draws of (kind, task) by weight. Kinds with weight 0 or no tasks are never drawn."""

    def __init__(self, weights: dict[str, float], tasks: dict[str, Sequence[Task]], seed: int = 0) -> None:
        for kind, w in weights.items():
            if kind not in ENV_KINDS:
                raise ValueError(f"config.envs.mixture.{kind}: unknown env kind (kinds: {', '.join(sorted(ENV_KINDS))})")
            if w < 0:
                raise ValueError(f"config.envs.mixture.{kind}: weight must be >= 0, got {w}")
            if w > 0 and not tasks.get(kind):
                raise ValueError(f"config.envs.mixture.{kind}: weight {w} but no {kind} tasks were given")
        self.kinds = [k for k, w in weights.items() if w > 0]
        if not self.kinds:
            raise ValueError("config.envs.mixture: every weight is 0")
        self.weights = [float(weights[k]) for k in self.kinds]
        self.tasks = {k: list(tasks[k]) for k in self.kinds}
        self.rng = random.Random(seed)
        self._order: dict[str, list[Task]] = {k: [] for k in self.kinds}

    @classmethod
    def from_config(cls, config: Any, tasks: dict[str, Sequence[Task]], seed: int | None = None) -> "MixtureSampler":
        mix = config.envs.mixture
        weights = {k: float(mix[k]) for k in mix.keys()}
        return cls(weights, tasks, int(config.seed) if seed is None else seed)

    def _next_task(self, kind: str) -> Task:
        if not self._order[kind]:
            order = list(self.tasks[kind])
            self.rng.shuffle(order)
            self._order[kind] = order
        return self._order[kind].pop()

    def sample(self, n: int) -> list[tuple[str, Task]]:
        """`n` draws; the kind of each by weight."""
        kinds = self.rng.choices(self.kinds, weights=self.weights, k=n)
        return [(k, self._next_task(k)) for k in kinds]
