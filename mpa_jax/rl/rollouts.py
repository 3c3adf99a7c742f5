"""One step's rollouts: `rl.group_size` episodes per drawn task through the `EpisodeRunner`, infra retries, and
the `Rollouts` record (groups, staleness, JSON round trip). No jax.

Episodes that end as infra (a lost device, an invalid simulator reply after retries, an engine fault) are re-run
with fresh seeds up to `rl.infra_retries` times, then dropped and counted per kind, never rewarded. Every
trajectory carries its task's competence key and cell in `provenance["competence_key"]` / `["competence_cell"]`
(`rl/competence.py`), so the outcomes of groups left out still reach the competence table.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Sequence

from mpa_jax import seeds


def step_seed(seed: int, step: int, attempt: int = 0) -> int:
    """The sampling seed of a step's rollouts (attempt > 0: infra retries)."""
    return seeds.derive("rl_draw", seed, step, attempt)


@dataclasses.dataclass
class Rollouts:
    """One step's verified rollouts (infra failures already retried or dropped)."""

    step: int
    draws: list[tuple[str, Any]]  # (kind, task) per group
    trajs: list[Any]
    groups: list[int]  # the group of each trajectory
    dropped: dict[str, int]  # infra episodes dropped after the retries, per kind
    rollout_s: float
    drawn: int = 0  # groups drawn to fill the step (selection: > the kept groups when some had no signal)
    unused: list[Any] = dataclasses.field(default_factory=list)  # verified episodes of groups left out (no signal)

    def with_groups(self, keep: Sequence[int]) -> "Rollouts":
        """Only groups `keep` (renumbered in that order); the others' episodes move to `unused` (they are
        outcomes all the same: competence for the next data stage, failure traces for the harness)."""
        new = {g: i for i, g in enumerate(keep)}
        idx = [i for i, g in enumerate(self.groups) if g in new]
        left = [t for t, g in zip(self.trajs, self.groups) if g not in new]
        return Rollouts(self.step, [self.draws[g] for g in keep], [self.trajs[i] for i in idx], [new[self.groups[i]] for i in idx],
                        dict(self.dropped), self.rollout_s, len(self.draws), self.unused + left)

    def extend(self, other: "Rollouts") -> "Rollouts":
        """These groups followed by `other`'s."""
        off = len(self.draws)
        dropped = dict(self.dropped)
        for k, v in other.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
        return Rollouts(self.step, self.draws + other.draws, self.trajs + other.trajs, self.groups + [g + off for g in other.groups],
                        dropped, self.rollout_s + other.rollout_s, self.drawn + other.drawn, self.unused + other.unused)

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
        return {"step": self.step, "draws": [[k, json.loads(t.to_json())] for k, t in self.draws], "trajs": [t.to_dict() for t in self.trajs],
                "groups": self.groups, "dropped": self.dropped, "rollout_s": self.rollout_s, "drawn": self.drawn,
                "unused": [t.to_dict() for t in self.unused]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Rollouts":
        """From `to_dict`: the draws carry their tasks (fresh selected instances are in no split)."""
        from mpa_jax.envs.contract import Task, Trajectory

        return cls(int(d["step"]), [(k, Task.from_dict(t)) for k, t in d["draws"]], [Trajectory.from_dict(t) for t in d["trajs"]],
                   [int(g) for g in d["groups"]], {k: int(v) for k, v in d["dropped"].items()}, float(d["rollout_s"]), int(d.get("drawn", 0)),
                   [Trajectory.from_dict(t) for t in d.get("unused", [])])


def group_rollouts(runner: Any, engine: Any, tokenizer: Any, draws: Sequence[tuple[str, Any]], *, rl: Any, rollout: Any,
                   seed: int, step: int, attempt0: int = 0) -> Rollouts:
    """`rl.group_size` rollouts of each drawn (kind, task) through `runner` (episode limits from the `rollout`
    section), sampling with `SamplingParams.for_ratios` semantics (top_p=1, top_k=-1) at `rl.temperature`; infra
    episodes re-run up to `rl.infra_retries` times with fresh seeds, then dropped and counted per kind."""
    from mpa_jax.rl.competence import keys_of_task
    from mpa_jax.rollout.runner import EpisodeConfig

    t0 = time.perf_counter()
    g = int(rl.group_size)
    pending = [gi for gi in range(len(draws)) for _ in range(g)]
    # each episode's sample index (mpa_jax.seeds): its task's occurrence count over the step's whole episode list, so
    # the rollouts of a group differ, a task drawn in two groups of one step gets distinct seeds, and a retry keeps them
    sample_of = seeds.occurrences(draws[gi][1].id for gi in pending)
    pending = list(range(len(pending)))
    group_of = [gi for gi in range(len(draws)) for _ in range(g)]
    done: list[tuple[int, Any]] = []
    for attempt in range(int(rl.infra_retries) + 1):
        if not pending:
            break
        # rounds: every batch on an idle engine, bitwise reproducible, so a resumed run samples what the first did
        cfg = EpisodeConfig.from_config(rollout, seed=step_seed(seed, step, attempt0 + attempt), temperature=float(rl.temperature),
                                        top_p=1.0, top_k=-1, planner=f"rl-{rl.algo}", schedule="rounds")
        trajs = runner.run(engine, tokenizer, [draws[group_of[e]][1] for e in pending], cfg,
                           kinds=[draws[group_of[e]][0] for e in pending], samples=[sample_of[e] for e in pending])
        retry = []
        for e, tr in zip(pending, trajs):
            gi = group_of[e]
            if tr.infra_failure:
                retry.append(e)
            else:
                tr.provenance["sampling"] = {"temperature": float(rl.temperature), "top_p": 1.0, "top_k": -1,
                                             "seed": cfg.seed, "for_ratios": True}
                tr.provenance["competence_key"], tr.provenance["competence_cell"] = keys_of_task(draws[gi][1])
                done.append((gi, tr))
        pending = retry
    dropped: dict[str, int] = {}
    for e in pending:
        kind = draws[group_of[e]][0]
        dropped[kind] = dropped.get(kind, 0) + 1
    return Rollouts(step, list(draws), [t for _, t in done], [gi for gi, _ in done], dropped, time.perf_counter() - t0, len(draws))
