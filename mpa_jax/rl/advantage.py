"""The `Care` role of the RL loop: advantages from a step's rollouts and the competence table (DESIGN §6).

    care = Care(config.rl, CompetenceTable.from_config(config.rl))
    plan = care.selection()            # for the rollout worker: the table as it stands (selection draws by it) and
                                       # the matched-arms keep rule priced with it (which groups a step trains on)
    scored = care.score(rollouts)      # per rollout: advantage, competence, lambda; per group: key, lambda, own
    care.observe(rollouts)             # fold the step's verified outcomes (kept *and* left-out groups) in

`score` reads competence before the step's outcomes are folded in (a step is priced by what was known when it
was sampled). `observe` counts the groups selection left out too: a table fed only with the groups kept *because*
they mixed successes and failures would sit near 0.5 whatever the policy can do (issue 50).
The maths is `rl/care.py`; the table `rl/competence.py`. No jax.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import numpy as np

from mpa_jax.rl import care as maths
from mpa_jax.rl.competence import CompetenceTable, keys_of_task, keys_of_trajectory
from mpa_jax.rl.rollouts import Rollouts


def _success(t: Any) -> bool:
    return bool(t.verification is not None and t.verification.success)


@dataclasses.dataclass
class Scored:
    """One step's rollouts as the learner and the logs need them (arrays are per rollout)."""

    advantages: np.ndarray
    success: np.ndarray
    score: np.ndarray
    output_tokens: np.ndarray
    tool_calls: np.ndarray
    competence: np.ndarray
    lam: np.ndarray  # lambda(c_k) of each rollout's key (0 for vanilla)
    groups: list[dict[str, Any]]  # per kept group: kind, key, cell, competence, lambda, own (the key had evidence)


@dataclasses.dataclass(frozen=True)
class Selection:
    """What competence-aware selection needs for one step: `competence`, a snapshot of the table (templates are
    drawn by it), and `keep(rollouts, group)`, the matched-arms rule priced with the same snapshot."""

    competence: CompetenceTable
    keep: Callable[[Rollouts, int], bool]


class Care:
    """Advantages and competence for one run (`rl`: the `config.rl` section)."""

    def __init__(self, rl: Any, table: CompetenceTable) -> None:
        maths.check_rl_config(rl)
        self.rl, self.table = rl, table
        self.is_care = str(rl.algo) == "care"

    def selection(self) -> Selection:
        """The step's `Selection`: a snapshot of the table now (a prefetch thread never sees a half-updated table)
        and the keep rule priced with it."""
        table = copy.deepcopy(self.table)
        return Selection(table, self.keep_rule(table))

    def keep_rule(self, table: CompetenceTable | None = None) -> Callable[[Rollouts, int], bool]:
        """`keep(rollouts, group)`: the group's rewards vary under CARE's reward or vanilla's (the same rule for both
        arms), with lambda from `table` (default: a snapshot of this run's table now)."""
        table, rl = (copy.deepcopy(self.table) if table is None else table), self.rl

        def keep(r: Rollouts, group: int) -> bool:
            idx = [i for i, g in enumerate(r.groups) if g == group]
            key, cell = keys_of_task(r.draws[group][1])
            trajs = [r.trajs[i] for i in idx]
            cost = maths.rollout_cost(np.asarray([t.costs.get("output_tokens", 0.0) for t in trajs], np.float64),
                                      np.asarray([t.costs.get("tool_calls", 0.0) for t in trajs], np.float64), rl)
            return maths.group_has_signal(success=np.asarray([_success(t) for t in trajs], bool), cost=cost,
                                          competence=np.full(len(idx), table.get(key, cell)), cfg=rl)

        return keep

    def score(self, rollouts: Rollouts) -> Scored:
        """Advantages of `rollouts` (kept groups) from the table as it stands; see the module docstring."""
        trajs, groups = rollouts.trajs, np.asarray(rollouts.groups, np.int64)
        group_keys = [keys_of_task(t) for _, t in rollouts.draws]
        keys = [group_keys[g][0] for g in groups]
        cells = [group_keys[g][1] for g in groups]
        success = np.asarray([_success(t) for t in trajs], bool)
        out_tok = np.asarray([t.costs.get("output_tokens", 0.0) for t in trajs], np.float64)
        calls = np.asarray([t.costs.get("tool_calls", 0.0) for t in trajs], np.float64)
        comp = self.table.lookup(keys, cells)
        key_ids = np.unique(np.asarray(keys, dtype=object), return_inverse=True)[1].astype(np.int64) if keys else np.zeros(0, np.int64)
        adv = maths.advantages(success=success, cost=maths.rollout_cost(out_tok, calls, self.rl), group=groups, key=key_ids,
                               competence=comp, cfg=self.rl) if len(trajs) else np.zeros(0)
        lam = maths.lambda_schedule(comp, self.rl) if self.is_care else np.zeros(len(trajs))
        per_group = []
        for g, (kind, _) in enumerate(rollouts.draws):
            key, cell = group_keys[g]
            c = self.table.get(key, cell)
            per_group.append({"kind": kind, "key": key, "cell": cell, "competence": round(c, 4),
                              "lambda": round(float(maths.lambda_schedule(c, self.rl)) if self.is_care else 0.0, 4),
                              "own": self.table.has_own(key), "evidence": round(self.table.evidence(key), 2)})
        return Scored(adv, success, np.asarray([float(t.verification.score) if t.verification is not None else 0.0 for t in trajs]),
                      out_tok, calls, comp, lam, per_group)

    def observe(self, rollouts: Rollouts) -> None:
        """Fold every verified episode of the step in, the groups selection left out included (module docstring).
        Simulated episodes count under their own keys and cells."""
        keys, cells, ok = [], [], []
        for t in list(rollouts.trajs) + list(rollouts.unused):
            if t.infra_failure or t.verification is None:
                continue
            k, c = keys_of_trajectory(t)
            keys.append(k)
            cells.append(c)
            ok.append(float(_success(t)))
        self.table.update(keys, cells, ok)
