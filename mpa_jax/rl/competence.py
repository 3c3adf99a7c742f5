"""CARE's competence c_k (DESIGN §6.1): verified success per task key, estimated with the evidence it has.

Three levels, each a decayed Beta-Binomial tally (successes s, episodes n) per entry:

    key    template x difficulty        e.g. "calc.tip_split#2"
    cell   domain x category x difficulty (the data stage's cells, `mpa_jax.data.keys`)
    global every verified episode

and the estimate of a level is shrunk toward its parent with `prior` pseudo-episodes:

    c_global = (S + prior * init) / (N + prior)          init = rl.competence_init (no evidence at all)
    c_cell   = (s_cell + prior * c_global) / (n_cell + prior)
    c_key    = (s_key + prior * c_cell) / (n_key + prior)

so a key with no episodes *is* its cell's value (not a batch-wide average), a key with a few borrows most of its
cell's, and one with many is its own. Decay is by episodes, not steps: when an entry receives m new episodes, its
old tally is first multiplied by (1 - 1/window)^m (`rl.competence_window`), so every entry remembers about its last
`window` episodes however rarely it is drawn (a per-step EMA would forget a template drawn once in 500 steps at
the rate of the busiest one). Updates within a step are order-independent. Seeded from trajectories (the data
stage's probe of the policy: `seed`); saved with the RL checkpoint (`to_dict` / `from_dict`).
No jax.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

LEVELS = ("key", "cell")
FORMAT = 2  # to_dict's layout; 1 was the per-template EMA of earlier builds


def task_key(template: str, difficulty: int) -> str:
    """The competence key of a task: template x difficulty."""
    return f"{template}#{int(difficulty)}"


def keys_of_task(task: Any) -> tuple[str, str]:
    """(key, cell) of a Task."""
    from mpa_jax.data.keys import key_of_task

    return task_key(task.template, task.difficulty), key_of_task(task)


def keys_of_template(template: Any) -> tuple[str, str]:
    """(key, cell) of a task template (`envs.taskgen` Template): those of every task it builds."""
    from mpa_jax.data.keys import make_key

    return task_key(template.name, template.difficulty), make_key(template.domain, template.category, template.difficulty)


def keys_of_trajectory(traj: Any) -> tuple[str, str]:
    """(key, cell) of a Trajectory: those the RL rollouts recorded, else from its provenance (difficulty from its
    template when absent)."""
    from mpa_jax.data.keys import key_of_trajectory

    p = traj.provenance
    if p.get("competence_key") and p.get("competence_cell"):
        return str(p["competence_key"]), str(p["competence_cell"])
    cell = key_of_trajectory(traj)
    return task_key(str(traj.provenance.get("template", "?")), int(cell.rsplit("/", 1)[1])), cell


class CompetenceTable:
    """Hierarchical, evidence-weighted, episode-decayed competence (module docstring)."""

    def __init__(self, *, window: float, prior: float, init: float) -> None:
        if not float(window) >= 1.0:
            raise ValueError(f"config.rl.competence_window={window} must be >= 1 (episodes an entry remembers)")
        if not float(prior) > 0.0:
            raise ValueError(f"config.rl.competence_prior={prior} must be > 0 (pseudo-episodes of the parent)")
        if not 0.0 <= float(init) <= 1.0:
            raise ValueError(f"config.rl.competence_init={init} must be in [0, 1]")
        self.window, self.prior, self.init = float(window), float(prior), float(init)
        self.tally: dict[str, dict[str, list[float]]] = {lv: {} for lv in LEVELS}
        self.total = [0.0, 0.0]  # the global (successes, episodes)
        self.parent: dict[str, str] = {}  # key -> its cell

    @classmethod
    def from_config(cls, rl: Any) -> "CompetenceTable":
        """From the `rl` config section."""
        return cls(window=float(rl.competence_window), prior=float(rl.competence_prior), init=float(rl.competence_init))

    # ---------------------------------------------------------------- estimates
    def _shrink(self, sn: Sequence[float] | None, parent: float) -> float:
        s, n = sn if sn is not None else (0.0, 0.0)
        return (s + self.prior * parent) / (n + self.prior)

    @property
    def global_value(self) -> float:
        return self._shrink(self.total, self.init)

    def cell_value(self, cell: str) -> float:
        return self._shrink(self.tally["cell"].get(cell), self.global_value)

    def get(self, key: str, cell: str) -> float:
        """c_k of `key` (in `cell`): its own evidence shrunk toward the cell's value."""
        return self._shrink(self.tally["key"].get(key), self.cell_value(cell))

    def lookup(self, keys: Sequence[str], cells: Sequence[str]) -> np.ndarray:
        return np.asarray([self.get(k, c) for k, c in zip(keys, cells)], np.float64)

    def evidence(self, key: str) -> float:
        """The (decayed) episodes behind `key`'s own estimate (0: it is its cell's value)."""
        return float(self.tally["key"].get(key, (0.0, 0.0))[1])

    def has_own(self, key: str) -> bool:
        return key in self.tally["key"]

    # ---------------------------------------------------------------- updates
    def _fold(self, entry: list[float], s: float, n: float) -> None:
        keep = (1.0 - 1.0 / self.window) ** n
        entry[0] = entry[0] * keep + s
        entry[1] = entry[1] * keep + n

    def update(self, keys: Sequence[str], cells: Sequence[str], success: Iterable[float]) -> None:
        """Fold verified outcomes in (infra failures must be left out by the caller); order-independent."""
        success = np.asarray(list(success), np.float64)
        if not (len(keys) == len(cells) == success.shape[0]):
            raise ValueError(f"CompetenceTable.update: {len(keys)} keys, {len(cells)} cells for {success.shape[0]} outcomes")
        if not len(keys):
            return
        for level, names in (("key", keys), ("cell", cells)):
            for name in sorted(set(names)):
                sel = np.asarray([x == name for x in names])
                self._fold(self.tally[level].setdefault(name, [0.0, 0.0]), float(success[sel].sum()), float(sel.sum()))
        for k, c in zip(keys, cells):
            self.parent[k] = c
        self._fold(self.total, float(success.sum()), float(len(keys)))

    def seed(self, trajs: Iterable[Any]) -> int:
        """Fold in the verified outcomes of `trajs` (e.g. the data stage's probe); returns how many counted."""
        keys, cells, ok = [], [], []
        for t in trajs:
            if t.infra_failure or t.verification is None:
                continue
            k, c = keys_of_trajectory(t)
            keys.append(k)
            cells.append(c)
            ok.append(float(bool(t.verification.success)))
        self.update(keys, cells, ok)
        return len(keys)

    # ---------------------------------------------------------------- state
    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (the RL checkpoint's `extra["competence"]`) with every estimate for reading."""
        return {"format": FORMAT, "window": self.window, "prior": self.prior, "init": self.init,
                "global": [self.total[0], self.total[1], self.global_value],
                "cells": {c: [s, n, self.cell_value(c)] for c, (s, n) in sorted(self.tally["cell"].items())},
                "keys": {k: [s, n, self.get(k, self.parent[k]), self.parent[k]] for k, (s, n) in sorted(self.tally["key"].items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CompetenceTable":
        if d.get("format") != FORMAT:
            raise ValueError(f"competence table of format {d.get('format', 1)}, this build reads {FORMAT} "
                             "(a checkpoint of an earlier build: start the RL run afresh)")
        t = cls(window=d["window"], prior=d["prior"], init=d["init"])
        t.total = [float(d["global"][0]), float(d["global"][1])]
        t.tally["cell"] = {c: [float(v[0]), float(v[1])] for c, v in d["cells"].items()}
        t.tally["key"] = {k: [float(v[0]), float(v[1])] for k, v in d["keys"].items()}
        t.parent = {k: str(v[3]) for k, v in d["keys"].items()}
        return t

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompetenceTable) and self.to_dict() == other.to_dict()
