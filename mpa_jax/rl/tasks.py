"""Which tasks an RL step trains on, across env kinds (the rollout worker draws from a `TaskSource`). No jax.

Tasks per kind (`config.envs.mixture` weights): the sandbox and the ADB device run the tasks of `rl.split`
(filtered by `rl.templates`); the simulated env runs its own long-tail training tasks (`rl.simulated_tasks`
of them, `envs.simulated.simulated_tasks`). Each step draws `rl.tasks_per_step` groups: a group's kind by
weight (a function of (seed, step, group), so resume is exact), its task from that kind's `TaskCursor`
(a seeded permutation per epoch; the positions are checkpointed). A group never mixes kinds: its
`rl.group_size` rollouts are episodes of one task on one kind (`rl/rollouts.py`).

Competence-aware selection (`rl.selection = "competence"`; CARE's spirit, DAPO's dynamic sampling): for the
kinds that run the benchmark's tools, each group is a *fresh* instance (instance seeds from
`FRESH_SEED_BASE`, disjoint from every split's; held-out templates never) of a template drawn with weight
`rl.select_floor + 4 c (1 - c)`, c the template's competence read from CARE's competence table (`rl/competence.py`,
the one source: the template's key template x difficulty, backed off to its cell and the global value, decayed by
episodes; it holds every verified episode the run has drawn, kept groups and left-out ones, and is seeded by any
prior: trajectories such as the data stage's probe, `prior=`, default `rl.select_prior`). The table a step draws by
is the one its keep rule prices with: a snapshot taken when the step's sampling starts, so the step's re-draws use
the same weights and the step's outcomes count from the next step on. Groups without reward variance are never
trained on (`rl/worker.py` re-draws them within `rl.select_tries`).

`split`, `selection` and `prior` default to `rl.split`, `rl.selection` and `rl.select_prior`; a caller such as
the loop passes its own explicitly instead of rewriting the config.

Fresh persona worlds (`rl.select_worlds = W > 0`): the instances are set in W persona worlds of no split
(`envs.benchmark.FRESH_PERSONA_BASE` and up) instead of the train split's six. The starter has learned its six
worlds' people and things: on fresh instances of train templates it succeeds 77.5% greedily in those worlds and
55.0% in unseen ones, its dev figure (docs/experiments.md); the dev and test worlds stay unseen either way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from mpa_jax.envs.base import ENV_KINDS
from mpa_jax.rl.competence import CompetenceTable, keys_of_template
from mpa_jax.rl.errors import RLSetupError

FRESH_SEED_BASE = 5_000_000  # instance seeds of selected RL tasks: above every split's (test < 2,000,000 + 100,000 x tasks.seed + 50,000)
SPLIT_KINDS = ("sandbox", "adb")  # kinds that run the benchmark's tasks (the device executes the sandbox's tools)


class TaskCursor:
    """Tasks drawn in a seeded permutation per epoch; `position` (tasks drawn so far) is the state."""

    def __init__(self, tasks: Sequence[Any], seed: int, position: int = 0):
        self.tasks = list(tasks)
        self.seed = int(seed)
        self.position = int(position)

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def draw(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.tasks))
            out.append(self.tasks[int(self._order(epoch)[i])])
            self.position += 1
        return out


def split_tasks(split: str, templates: str, tasks_cfg: Any) -> list[Any]:
    """The tasks of `split` (a split or a tasks JSONL; `config.tasks` seeds it), restricted to the comma-separated
    `templates` (`rl.templates`) when set."""
    from mpa_jax.envs import load_tasks

    tasks = list(load_tasks(str(split), seed=int(tasks_cfg.seed), per_template=int(tasks_cfg.per_template)))
    names = [t.strip() for t in str(templates).split(",") if t.strip()]
    if names:
        known = {t.template for t in tasks}
        missing = [n for n in names if n not in known]
        if missing:
            raise RLSetupError(f"config.rl.templates: no task of split {split!r} has template(s) {missing}")
        tasks = [t for t in tasks if t.template in set(names)]
    if not tasks:
        raise RLSetupError(f"config.rl.split={split!r} has no tasks")
    return tasks


class Selector:
    """Competence-aware choice of fresh train instances (module docstring). Its state is the instance counter; the
    competence it draws by is CARE's table, passed to `draw`."""

    def __init__(self, rl: Any, seed: int, tasks_seed: int) -> None:
        """`rl`: the `config.rl` section; `seed`: `config.seed`; `tasks_seed`: `config.tasks.seed`."""
        from mpa_jax.envs.benchmark import FRESH_PERSONA_BASE, templates_for

        self.seed, self.floor = int(seed), float(rl.select_floor)
        if int(tasks_seed) * 100_000 + 2_100_000 > FRESH_SEED_BASE:
            raise RLSetupError(f"config.tasks.seed={tasks_seed}: the benchmark's seeds would reach the fresh RL seeds")
        names = [t.strip() for t in str(rl.templates).split(",") if t.strip()]
        self.templates = [t for t in templates_for("train") if not names or t.name in names]  # held-out templates never
        if names and len(self.templates) != len(set(names)):
            known = {t.name for t in self.templates}
            raise RLSetupError(f"config.rl.templates: {sorted(set(names) - known)} are not train templates (held-out or unknown)")
        self.drawn = 0  # fresh instances built so far: the next seed
        if int(rl.select_worlds) < 0:
            raise RLSetupError(f"config.rl.select_worlds must be >= 0, got {rl.select_worlds}")
        self.worlds = tuple(range(FRESH_PERSONA_BASE, FRESH_PERSONA_BASE + int(rl.select_worlds))) or None  # None: the split's

    @property
    def state(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def restore(self, state: dict[str, Any]) -> None:
        """From `state` (a checkpoint's; per-template counts of earlier builds and the retired focus pool's
        bookkeeping are not read: the table is the source)."""
        self.drawn = int(state["drawn"])

    def competence(self, table: CompetenceTable) -> dict[str, float]:
        """Each template's competence in `table` (its key, backed off to its cell and the global value)."""
        return {t.name: table.get(*keys_of_template(t)) for t in self.templates}

    def weights(self, table: CompetenceTable) -> list[float]:
        """`rl.select_floor + 4 c (1 - c)` per template, c from `table`."""
        c = self.competence(table)
        return [self.floor + 4.0 * c[t.name] * (1.0 - c[t.name]) for t in self.templates]

    def draw(self, step: int, attempt: int, n: int, table: CompetenceTable) -> list[Any]:
        """`n` fresh gated instances of templates drawn by weight from `table` (deterministic in (seed, step,
        attempt) and the table)."""
        from mpa_jax.envs.benchmark import build_task
        from mpa_jax.envs.gate import check_task
        from mpa_jax.envs.sandbox import SandboxEnv

        rng = np.random.default_rng([self.seed, int(step), int(attempt), 29])
        w = np.asarray(self.weights(table), np.float64)
        env = SandboxEnv()
        out: list[Any] = []
        try:
            while len(out) < n:
                template = self.templates[int(rng.choice(len(self.templates), p=w / w.sum()))]
                inst = FRESH_SEED_BASE + self.seed * 100_000 + self.drawn
                self.drawn += 1
                task = build_task(template, "train", inst, personas=self.worlds)
                if task is None:
                    continue
                task = dataclasses.replace(task, id=f"train/rl/{template.name}/{inst}", metadata={**task.metadata, "source": "rl-select"})
                if check_task(task, env) is None:  # the quality gate, as for every generated task
                    out.append(task)
        finally:
            env.close()
        return out


def mixture_weights(envs: Any) -> dict[str, float]:
    """`config.envs.mixture` (of the `envs` section) as {kind: weight > 0}; one clear error for an unknown kind, a
    negative or all-zero weight."""
    mix = envs.mixture
    weights = {}
    for kind in mix.keys():
        if kind not in ENV_KINDS:  # the one list of env kinds (bfcl/agentdojo draw their train split: kind_tasks)
            raise RLSetupError(f"config.envs.mixture.{kind}: unknown env kind (kinds: {', '.join(ENV_KINDS)})")
        w = float(mix[kind])
        if w < 0:
            raise RLSetupError(f"config.envs.mixture.{kind}: weight must be >= 0, got {w}")
        if w > 0:
            weights[kind] = w
    if not weights:
        raise RLSetupError("config.envs.mixture: every weight is 0")
    if "adb" in weights and not str(envs.adb.device):
        raise RLSetupError("config.envs.mixture.adb > 0 needs a device: config.envs.adb.device")
    return weights


class TaskSource:
    """The step's groups: (kind, task) pairs drawn by the mixture weights (module docstring)."""

    def __init__(self, rl: Any, envs: Any, tasks_cfg: Any, seed: int, *, split: str | None = None,
                 selection: str | None = None, prior: str | None = None, tasks: Sequence[Any] | None = None) -> None:
        """Sections `rl`, `envs`, `tasks` and `config.seed`; `split` / `selection` / `prior` override `rl.split` /
        `rl.selection` / `rl.select_prior`; `tasks` replaces the split's tasks outright."""
        self.seed = int(seed)
        self.weights = mixture_weights(envs)
        self.kinds = list(self.weights)
        split_name = str(rl.split) if split is None else str(split)
        split = list(tasks) if tasks is not None else (split_tasks(split_name, str(rl.templates), tasks_cfg)
                                                       if any(k in SPLIT_KINDS for k in self.kinds) else [])
        by_kind: dict[str, list[Any]] = {}
        for kind in self.kinds:
            if kind == "simulated":
                from mpa_jax.envs.simulated import simulated_tasks

                by_kind[kind] = simulated_tasks(int(rl.simulated_tasks), seed=self.seed)
            elif kind in ("bfcl", "agentdojo"):
                import ml_collections

                from mpa_jax.envs.base import kind_tasks

                by_kind[kind] = kind_tasks(kind, ml_collections.ConfigDict({"envs": envs}), "train")
            else:
                by_kind[kind] = split
        # the sandbox cursor keeps the seed of a sandbox-only run: a single-kind run draws as it always did
        self.cursors = {k: TaskCursor(by_kind[k], self.seed if i == 0 else self.seed * 31 + i) for i, k in enumerate(self.kinds)}
        self.tasks = [t for k in self.kinds for t in by_kind[k]]
        mode = str(rl.selection) if selection is None else str(selection)
        if mode not in ("cursor", "competence"):
            raise RLSetupError(f"config.rl.selection must be 'cursor' or 'competence', got {mode!r}")
        self.selector = Selector(rl, self.seed, int(tasks_cfg.seed)) if mode == "competence" and any(k in SPLIT_KINDS for k in self.kinds) else None
        self.tries = int(rl.select_tries) if self.selector is not None else 1
        self.prior = str(rl.select_prior) if prior is None else str(prior)
        self.prior_trajs = read_trajectories(self.prior) if self.prior else []  # seeds the competence table (the trainer)
        if self.selector is not None and self.tries < 1:
            raise RLSetupError(f"config.rl.select_tries must be >= 1, got {self.tries}")

    @property
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: c.position for k, c in self.cursors.items()}
        if self.selector is not None:
            out["selector"] = self.selector.state
        return out

    def restore(self, state: Any) -> None:
        """From a checkpoint's cursor state (an int from runs before the mixture: the first kind's position)."""
        if isinstance(state, int):
            state = {self.kinds[0]: state}
        for k, pos in state.items():
            if k == "selector" and self.selector is not None:
                self.selector.restore(pos)
            elif k in self.cursors:
                self.cursors[k].position = int(pos)

    def _kinds(self, step: int, n: int, salt: int = 0) -> list[str]:
        if len(self.kinds) == 1:
            return [self.kinds[0]] * n
        p = np.asarray([self.weights[k] for k in self.kinds], np.float64)
        idx = np.random.default_rng([self.seed, int(step), 17 + salt]).choice(len(self.kinds), size=n, p=p / p.sum())
        return [self.kinds[int(i)] for i in idx]

    def draw(self, step: int, n: int, attempt: int = 0, competence: CompetenceTable | None = None) -> list[tuple[str, Any]]:
        """`n` groups of step `step`: the kind of each by weight, the task from that kind's cursor (or, with
        selection, a fresh instance for the kinds that run the benchmark's tools, by `competence`: the table)."""
        kinds = self._kinds(step, n, attempt)
        fresh = None
        if self.selector is not None:
            if competence is None:
                raise ValueError("TaskSource.draw: competence-aware selection draws by the competence table (competence=)")
            fresh = iter(self.selector.draw(step, attempt, sum(k in SPLIT_KINDS for k in kinds), competence))
        out = []
        for k in kinds:
            if fresh is not None and k in SPLIT_KINDS:
                out.append((k, next(fresh)))
            else:
                out.append((k, self.cursors[k].draw(1)[0]))
        return out

    @property
    def template_names(self) -> list[str]:
        """Every template a step can draw (the keys of CARE's per-key cost normalisation)."""
        names = {t.template for t in self.tasks} | ({t.name for t in self.selector.templates} if self.selector is not None else set())
        return sorted(names)



def read_trajectories(path: str) -> list[Any]:
    """Trajectories of a JSONL file or of every JSONL file in a directory."""
    import os

    from mpa_jax.envs.contract import Trajectory, read_jsonl

    if os.path.isdir(path):
        return [t for f in sorted(os.listdir(path)) if f.endswith(".jsonl") for t in read_jsonl(os.path.join(path, f), Trajectory)]
    if not os.path.isfile(path):
        raise RLSetupError(f"the competence prior (rl.select_prior) {path!r} is neither a trajectories JSONL nor a directory of them")
    return read_jsonl(path, Trajectory)
