"""The RL step's log (mpa_jax.rl.step_log): lambda over the step's groups and the own-key share in the metrics, and a
step that updated nothing says why in its console line instead of `clip nan gap nan`."""
from __future__ import annotations

import numpy as np

from mpa_jax.rl.advantage import Scored
from mpa_jax.rl.competence import CompetenceTable
from mpa_jax.rl.learner import UpdateReport
from mpa_jax.rl.rollouts import Rollouts
from mpa_jax.rl.step_log import console_line, step_metrics


class _Task:
    def __init__(self, name):
        self.id, self.template = f"t/{name}", name


def _step(groups, updates, success):
    n = len(success)
    draws = [("sandbox", _Task(g["key"])) for g in groups]
    r = Rollouts(0, draws, [object()] * n, [i * len(groups) // n for i in range(n)], {}, 1.0, drawn=len(groups) + 1)
    scored = Scored(np.where(updates, np.where(success, 1.0, -1.0), 0.0) if updates else np.zeros(n), np.asarray(success),
                    np.zeros(n), np.full(n, 10.0), np.ones(n), np.full(n, 0.5), np.full(n, 0.2), groups)
    ups = [{"clip_frac": 0.0, "logprob_gap": 1e-5, "tokens": 100.0, "loss": 0.1, "grad_norm": 1.0, "lr": 1e-4, "ratio_max": 1.0,
            "ratio_min": 1.0}] if updates else []
    report = UpdateReport(ups, {"row_len": 128, "rows_per_device": 1, "micro_batches": len(ups)}, n if updates else 0)
    return step_metrics(r, scored, report, CompetenceTable(window=8, prior=1, init=0.5), version=1, times={"rollout_s": 1.0})


def test_lambda_over_groups_and_own_key_share():
    groups = [{"key": "a#1", "lambda": 0.1, "competence": 0.4, "own": True}, {"key": "b#1", "lambda": 0.5, "competence": 0.9, "own": False}]
    m = _step(groups, True, [True, False, True, False])
    assert (m["rl/lambda_min"], m["rl/lambda"], m["rl/lambda_max"]) == (0.1, 0.3, 0.5)
    assert m["rl/own_key_share"] == 0.5 and m["rl/competence"] == 0.65
    assert "clip 0.000" in console_line(1, 5, m) and "lambda 0.10/0.30/0.50" in console_line(1, 5, m)


def test_a_step_that_updated_nothing_says_why():
    groups = [{"key": "a#1", "lambda": 0.0, "competence": 0.1, "own": False}]
    line = console_line(3, 5, _step(groups, False, [True, True]))
    assert "clip" not in line and "gap" not in line and "no update: all 1 groups unanimous" in line
