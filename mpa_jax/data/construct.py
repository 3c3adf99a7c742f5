"""Task construction by domain x category x difficulty through the sandbox generators.

Cells ("domain/category/difficulty") are drawn by the generation weights (uniform over the cells the
split can produce when none are given), a template of the cell is drawn, instantiated with a fresh
instance seed, optionally paraphrased, and kept only when it passes the quality gate (gold passes with
the tool API only, doing nothing fails, corrupted solutions fail, replay is identical). Instance seeds
live in a range of their own per round, disjoint from the benchmark's train/dev/test seeds, and
held-out templates are never used for train, so constructed data cannot leak into evaluation.
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any, Callable, Mapping

from mpa_jax.data.keys import key_of_task, make_key

# Train instance seeds of the benchmark are < 100_000 per tasks.seed step; dev starts at 1_000_000.
CONSTRUCT_SEED_BASE = 400_000
ROUND_STRIDE = 20_000


@dataclasses.dataclass
class ConstructStats:
    """What construction did: drawn per cell, kept, rejected by the gate (with a sample reason)."""

    wanted: int = 0
    kept: int = 0
    draws: int = 0
    unusable: int = 0
    duplicates: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    by_key: dict[str, int] = dataclasses.field(default_factory=dict)
    paraphrased: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def construct_tasks(
    n: int,
    weights: Mapping[str, float] | None = None,
    *,
    split: str = "train",
    round_index: int = 0,
    seed: int = 0,
    paraphrase: Callable[[Any], str | None] | None = None,
    max_draws_per_task: int = 6,
) -> tuple[list[Any], ConstructStats]:
    """`n` gated tasks of `split` drawn over cells by `weights` (cell -> weight; missing cells get 0).

    `paraphrase(task) -> str | None` may rewrite the instruction (any planner backend); the rewritten
    task goes through the gate again. Returns the tasks and the construction statistics.
    """
    from mpa_jax.envs.benchmark import build_task, templates_for
    from mpa_jax.envs.gate import check_task
    from mpa_jax.envs.sandbox import SandboxEnv

    if n < 0:
        raise ValueError(f"construct_tasks: n must be >= 0, got {n}")
    by_cell: dict[str, list[Any]] = collections.defaultdict(list)
    for t in templates_for(split):
        by_cell[make_key(t.domain, t.category, t.difficulty)].append(t)
    cells = sorted(by_cell)
    if weights:
        unknown = sorted(set(weights) - set(cells))
        if unknown and not set(weights) & set(cells):
            raise ValueError(f"construct_tasks: none of the weighted cells exist for split {split!r} (e.g. {unknown[0]!r})")
        w = [max(0.0, float(weights.get(c, 0.0))) for c in cells]
    else:
        w = [1.0] * len(cells)
    if sum(w) <= 0:
        raise ValueError("construct_tasks: the generation weights are all zero")
    rng = random.Random(f"construct|{split}|{seed}|{round_index}")
    stats = ConstructStats(wanted=n)
    env = SandboxEnv()
    seen: set[str] = set()
    out: list[Any] = []
    base = CONSTRUCT_SEED_BASE + ROUND_STRIDE * int(round_index) + 1000 * int(seed)
    try:
        while len(out) < n and stats.draws < n * max_draws_per_task:
            cell = rng.choices(cells, weights=w)[0]
            template = rng.choice(by_cell[cell])
            inst = base + stats.draws
            stats.draws += 1
            task = build_task(template, split, inst)
            if task is None:
                stats.unusable += 1
                continue
            if paraphrase is not None:
                text = paraphrase(task)
                if text and text.strip() and text.strip() != task.instruction:
                    task = dataclasses.replace(task, instruction=text.strip(),
                                               metadata={**task.metadata, "paraphrased": True})
                    stats.paraphrased += 1
            # The id seeds the task's faults: set it before the gate so the gated task is the one kept.
            task = dataclasses.replace(task, id=f"{split}/r{round_index}/{template.name}/{inst}",
                                       metadata={**task.metadata, "round": int(round_index), "source": "construct"})
            dedup = f"{task.persona_seed}|{task.instruction}|{task.history}|{task.initial_state}"
            if dedup in seen:
                stats.duplicates += 1
                continue
            seen.add(dedup)
            reason = check_task(task, env)
            if reason is not None:
                stats.rejected[template.name] = stats.rejected.get(template.name, 0) + 1
                stats.reasons.setdefault(template.name, reason)
                continue
            out.append(task)
            k = key_of_task(task)
            stats.by_key[k] = stats.by_key.get(k, 0) + 1
    finally:
        env.close()
    stats.kept = len(out)
    return out, stats
