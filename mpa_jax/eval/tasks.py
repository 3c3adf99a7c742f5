"""Which tasks an evaluation runs: one stratified selection, optionally split into templates seen in training
and held-out templates (no jax).

    select_tasks("dev", n_seen=32, n_held_out=16)   # the demo's and the loop's 48 dev tasks
    select_tasks("test", n=32)                       # 32 test tasks spread over domain x category
"""
from __future__ import annotations

import functools
from typing import Any, Sequence


@functools.lru_cache(maxsize=1)
def held_out_templates() -> frozenset[str]:
    """Names of the templates the train split never uses."""
    from mpa_jax.envs.taskgen import TEMPLATES

    return frozenset(t.name for t in TEMPLATES if t.held_out)


def template_group(template: str) -> str:
    """"held_out" for a held-out template, else "seen" (the grouping key of `eval.metrics`)."""
    return "held_out" if template in held_out_templates() else "seen"


def stratified(tasks: Sequence[Any], n: int) -> list[Any]:
    """`n` tasks spread over (domain, category) cells, deterministically (n <= 0: all, in their order).

    Cells are visited on a diagonal walk (the k-th visit takes domain k mod D and category
    (k mod D + k div D) mod C), so any D consecutive picks cover every domain and the categories
    rotate; then round-robin in depth. A split's head alone would be one domain.
    """
    tasks = list(tasks)
    if n <= 0:
        return tasks
    n = min(n, len(tasks))
    cells: dict[tuple[str, str], list[Any]] = {}
    for t in tasks:
        cells.setdefault((t.domain, t.category), []).append(t)
    domains = sorted({d for d, _ in cells})
    categories = sorted({c for _, c in cells})
    nd, nc = len(domains), len(categories)
    walk = [(domains[k % nd], categories[(k % nd + k // nd) % nc]) for k in range(nd * nc)]
    order = [cell for cell in walk if cell in cells]
    out: list[Any] = []
    depth = 0
    while len(out) < n:
        for key in order:
            if depth < len(cells[key]) and len(out) < n:
                out.append(cells[key][depth])
        depth += 1
    return out


def select_tasks(split: str, *, n: int = 0, n_seen: int = 0, n_held_out: int = 0, seed: int = 0,
                 per_template: int = 0) -> list[Any]:
    """Tasks of `split` (a split name or a task JSONL): `n_seen` of templates seen in training followed by
    `n_held_out` of held-out templates when either is set, else `n` of all (0 = every task); each part
    stratified over (domain, category)."""
    from mpa_jax.envs import load_tasks

    tasks = load_tasks(split, seed=seed, per_template=per_template)
    if n_seen or n_held_out:
        ho = held_out_templates()
        seen = [t for t in tasks if t.template not in ho]
        held = [t for t in tasks if t.template in ho]
        return (stratified(seen, n_seen) if n_seen else []) + (stratified(held, n_held_out) if n_held_out else [])
    return stratified(tasks, n)
