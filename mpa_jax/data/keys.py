"""The data key of a task or trajectory: "domain/category/difficulty" (the cells data is balanced over)."""
from __future__ import annotations

import functools
from typing import Any

KEY_SEP = "/"


@functools.lru_cache(maxsize=1)
def _difficulty_by_template() -> dict[str, int]:
    from mpa_jax.envs.taskgen import TEMPLATES

    return {t.name: int(t.difficulty) for t in TEMPLATES}


def make_key(domain: str, category: str, difficulty: int) -> str:
    return f"{domain}{KEY_SEP}{category}{KEY_SEP}{int(difficulty)}"


def key_of_task(task: Any) -> str:
    """The cell of a Task."""
    return make_key(task.domain, task.category, task.difficulty)


def key_of_trajectory(traj: Any) -> str:
    """The cell of a Trajectory, from its provenance (difficulty from the generating template)."""
    p = traj.provenance
    diff = p.get("difficulty")
    if diff is None:
        diff = _difficulty_by_template().get(str(p.get("template", "")), 0)
    return make_key(str(p.get("domain", "?")), str(p.get("category", "?")), int(diff))


def all_keys(split: str = "train") -> list[str]:
    """Every cell the generators of `split` can produce (held-out templates excluded from train)."""
    from mpa_jax.envs.benchmark import templates_for

    return sorted({make_key(t.domain, t.category, t.difficulty) for t in templates_for(split)})
