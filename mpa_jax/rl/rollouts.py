"""RL rollouts: which tasks each step trains on (across env kinds), group rollouts through the episode runner,
infra retries, and staleness. No jax: this is the actor side of the RL loop.

Tasks per kind (`config.envs.mixture` weights): the sandbox and the ADB device run the tasks of `rl.split`
(filtered by `rl.templates`); the simulated env runs its own long-tail training tasks (`rl.simulated_tasks`
of them, `envs.simulated.simulated_tasks`). Each step draws `rl.tasks_per_step` groups: a group's kind by
weight (a function of (seed, step, group), so resume is exact), its task from that kind's `TaskCursor`
(a seeded permutation per epoch; the positions are checkpointed). A group never mixes kinds: its
`rl.group_size` rollouts are episodes of one task on one kind. Episodes that end as infra (a lost device,
an invalid simulator reply after retries, an engine fault) are re-run with fresh seeds up to
`rl.infra_retries` times, then dropped and counted per kind, never rewarded.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

KINDS = ("sandbox", "simulated", "adb")
SPLIT_KINDS = ("sandbox", "adb")  # kinds that run the benchmark's tasks (the device executes the sandbox's tools)


class RLSetupError(ValueError):
    """The RL run cannot start: a config key, the init checkpoint or the task filter is wrong (named)."""


def step_seed(seed: int, step: int, attempt: int = 0) -> int:
    """The sampling seed of a step's rollouts (attempt > 0: infra retries)."""
    return (int(seed) * 1_000_003 + int(step) * 7_919 + int(attempt) * 104_729) % (2**31 - 1)


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


def split_tasks(config: Any) -> list[Any]:
    """The tasks of `rl.split` (a split or a tasks JSONL), restricted to `rl.templates` when set."""
    from mpa_jax.envs import load_tasks

    tasks = list(load_tasks(str(config.rl.split), seed=int(config.tasks.seed), per_template=int(config.tasks.per_template)))
    names = [t.strip() for t in str(config.rl.templates).split(",") if t.strip()]
    if names:
        known = {t.template for t in tasks}
        missing = [n for n in names if n not in known]
        if missing:
            raise RLSetupError(f"config.rl.templates: no task of split {config.rl.split!r} has template(s) {missing}")
        tasks = [t for t in tasks if t.template in set(names)]
    if not tasks:
        raise RLSetupError(f"config.rl.split={config.rl.split!r} has no tasks")
    return tasks


def mixture_weights(config: Any) -> dict[str, float]:
    """`config.envs.mixture` as {kind: weight > 0}; one clear error for an unknown kind, a negative or all-zero weight."""
    mix = config.envs.mixture
    weights = {}
    for kind in mix.keys():
        if kind not in KINDS:
            raise RLSetupError(f"config.envs.mixture.{kind}: unknown env kind (kinds: {', '.join(KINDS)})")
        w = float(mix[kind])
        if w < 0:
            raise RLSetupError(f"config.envs.mixture.{kind}: weight must be >= 0, got {w}")
        if w > 0:
            weights[kind] = w
    if not weights:
        raise RLSetupError("config.envs.mixture: every weight is 0")
    if "adb" in weights and not str(config.envs.adb.device):
        raise RLSetupError("config.envs.mixture.adb > 0 needs a device: config.envs.adb.device")
    return weights


class TaskSource:
    """The step's groups: (kind, task) pairs drawn by the mixture weights (module docstring)."""

    def __init__(self, config: Any, tasks: Sequence[Any] | None = None) -> None:
        self.seed = int(config.seed)
        self.weights = mixture_weights(config)
        self.kinds = list(self.weights)
        split = list(tasks) if tasks is not None else (split_tasks(config) if any(k in SPLIT_KINDS for k in self.kinds) else [])
        by_kind: dict[str, list[Any]] = {}
        for kind in self.kinds:
            if kind == "simulated":
                from mpa_jax.envs.simulated import simulated_tasks

                by_kind[kind] = simulated_tasks(int(config.rl.simulated_tasks), seed=self.seed)
            else:
                by_kind[kind] = split
        # the sandbox cursor keeps the seed of a sandbox-only run: a single-kind run draws as it always did
        self.cursors = {k: TaskCursor(by_kind[k], self.seed if i == 0 else self.seed * 31 + i) for i, k in enumerate(self.kinds)}
        self.tasks = [t for k in self.kinds for t in by_kind[k]]

    @property
    def state(self) -> dict[str, int]:
        return {k: c.position for k, c in self.cursors.items()}

    def restore(self, state: Any) -> None:
        """From a checkpoint's cursor state (an int from runs before the mixture: the first kind's position)."""
        if isinstance(state, int):
            state = {self.kinds[0]: state}
        for k, pos in state.items():
            if k in self.cursors:
                self.cursors[k].position = int(pos)

    def draw(self, step: int, n: int) -> list[tuple[str, Any]]:
        """`n` groups of step `step`: the kind of each by weight, the task from that kind's cursor."""
        if len(self.kinds) == 1:
            kinds = [self.kinds[0]] * n
        else:
            p = np.asarray([self.weights[k] for k in self.kinds], np.float64)
            idx = np.random.default_rng([self.seed, int(step), 17]).choice(len(self.kinds), size=n, p=p / p.sum())
            kinds = [self.kinds[int(i)] for i in idx]
        return [(k, self.cursors[k].draw(1)[0]) for k in kinds]

    def by_id(self) -> dict[tuple[str, str], Any]:
        return {(k, t.id): t for k, c in self.cursors.items() for t in c.tasks}


@dataclasses.dataclass
class Rollouts:
    """One step's verified rollouts (infra failures already retried or dropped)."""

    step: int
    draws: list[tuple[str, Any]]  # (kind, task) per group
    trajs: list[Any]
    groups: list[int]  # the group of each trajectory
    dropped: dict[str, int]  # infra episodes dropped after the retries, per kind
    rollout_s: float

    @property
    def tasks(self) -> list[Any]:
        return [t for _, t in self.draws]

    def kind_of(self, i: int) -> str:
        return self.draws[self.groups[i]][0]

    def staleness(self, learner_version: int) -> int:
        """Learner weight version minus the oldest version any of these rollouts sampled with."""
        used = [int(v) for t in self.trajs for v in (t.provenance.get("weight_versions") or [t.provenance.get("weight_version", 0)])]
        return learner_version - min(used) if used else 0

    def drop_stale(self, version: int, max_staleness: int) -> int:
        """Drop rollouts sampled with weights more than `max_staleness` versions behind `version`."""
        keep = [i for i, t in enumerate(self.trajs)
                if version - min(int(v) for v in (t.provenance.get("weight_versions") or [version])) <= max_staleness]
        n = len(self.trajs) - len(keep)
        self.trajs, self.groups = [self.trajs[i] for i in keep], [self.groups[i] for i in keep]
        return n

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "draws": [[k, t.id] for k, t in self.draws], "trajs": [t.to_dict() for t in self.trajs],
                "groups": self.groups, "dropped": self.dropped, "rollout_s": self.rollout_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: TaskSource) -> "Rollouts":
        from mpa_jax.envs.contract import Trajectory

        by_id = source.by_id()
        return cls(int(d["step"]), [(k, by_id[(k, i)]) for k, i in d["draws"]], [Trajectory.from_dict(t) for t in d["trajs"]],
                   [int(g) for g in d["groups"]], {k: int(v) for k, v in d["dropped"].items()}, float(d["rollout_s"]))


def group_rollouts(runner: Any, engine: Any, tokenizer: Any, draws: Sequence[tuple[str, Any]], config: Any, step: int) -> Rollouts:
    """`rl.group_size` rollouts of each drawn (kind, task) through `runner`, sampling with
    `SamplingParams.for_ratios` semantics (top_p=1, top_k=-1) at `rl.temperature`; infra episodes re-run up
    to `rl.infra_retries` times with fresh seeds, then dropped and counted per kind."""
    from mpa_jax.rollout.runner import EpisodeConfig

    rl = config.rl
    t0 = time.perf_counter()
    g = int(rl.group_size)
    pending = [gi for gi in range(len(draws)) for _ in range(g)]
    done: list[tuple[int, Any]] = []
    for attempt in range(int(rl.infra_retries) + 1):
        if not pending:
            break
        cfg = EpisodeConfig.from_config(config.rollout, seed=step_seed(config.seed, step, attempt), temperature=float(rl.temperature),
                                        top_p=1.0, top_k=-1, planner=f"rl-{rl.algo}")
        trajs = runner.run(engine, tokenizer, [draws[gi][1] for gi in pending], cfg, kinds=[draws[gi][0] for gi in pending])
        retry = []
        for gi, tr in zip(pending, trajs):
            if tr.infra_failure:
                retry.append(gi)
            else:
                tr.provenance["sampling"] = {"temperature": float(rl.temperature), "top_p": 1.0, "top_k": -1,
                                             "seed": cfg.seed, "for_ratios": True}
                done.append((gi, tr))
        pending = retry
    dropped: dict[str, int] = {}
    for gi in pending:
        dropped[draws[gi][0]] = dropped.get(draws[gi][0], 0) + 1
    return Rollouts(step, list(draws), [t for _, t in done], [gi for gi, _ in done], dropped, time.perf_counter() - t0)
