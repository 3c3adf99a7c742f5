"""The pre-registered RL and CARE experiment (issue 53, item 2): frozen before any of its runs.

    mpa experiment prereg --config configs/prereg_rl.py --workdir runs/prereg    # every arm not yet recorded (resumes)
    mpa experiment prereg --config configs/prereg_rl.py --table                  # table + plot from the records

What it is for: to measure, on the pre-registered test set (all 600 tasks of `mpa_jax/eval/preregistered_test.json`,
greedy, harness off) and nowhere else, (a) whether CARE stays within 2 points of vanilla with at least 25% fewer
output tokens, and (b) whether RL lifts a start by at least 8 points on held-out templates. The recipe is
configs/rl_lift.py's (competence-aware selection of fresh train instances, AdamW 5e-5, temperature 1, CARE's
lambda schedule 0 -> 0.5 from competence 0.3 to 0.8, competence per template x difficulty backed off to cell and
global) at a fixed budget: 40 steps of 8 groups x 8 rollouts (2,560 training episodes per arm).

The arms (`prereg.arms`, run in this order; each writes one record into `prereg.results` when finished):
- `care-s{0,1,2}` / `vanilla-s{0,1,2}`: CARE as designed (beta 0, no failure term) and vanilla group-relative RL
  from the shipped starter, seeds 0, 1, 2. Both keep the same groups (matched arms, `rl/care.py`).
- `care+beta-s0`: CARE with `rl.beta = 0.5` (successes on hard keys amplified by 1 + beta (1 - c_k)).
- `care+failure-s0`: CARE with `rl.failure_cost = 1.0` (a failure in a group with a success pays up to
  lambda(c_k) for its length). The issue names this ablation "vanilla + failure term"; in the code the failure
  term is -failure_cost x lambda(c_k) x (1 + fail_hat) / 2 and exists only under `rl.algo = "care"` (vanilla's
  reward is the 0/1 outcome whatever `failure_cost` is), so the failure term is measured as CARE + failure term
  against CARE (its marginal effect) and against vanilla (the recipe of the pre-issue-50 "met" result).
- `start`: the shipped starter itself, evaluated once (what the RL arms are measured against).
- `refresh` + `care-refresh-s0` / `vanilla-refresh-s0`: the other start, a world-general SFT refresh of the
  starter (300 steps at 1e-4 on oracle demonstrations of 4 instances of every train template in 1,024 persona
  worlds of no split; `mpa_jax.sft.world_refresh`), evaluated, then CARE and vanilla from it, seed 0.
Results: docs/prereg/rl/ (records) and docs/preregistered.md (the pre-registration and the table).
"""
import os

import ml_collections

from mpa_jax.config import load_config_file


def _arm(name: str, start: str, algo: str, seed: int, beta: float = 0.0, failure_cost: float = 0.0) -> dict:
    return {"name": name, "start": start, "algo": algo, "seed": seed, "beta": beta, "failure_cost": failure_cost}


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "rl_lift.py"))
    c.name = "prereg_rl"
    r = c.rl
    r.steps, r.tasks_per_step, r.group_size = 40, 8, 8  # the budget; the lr schedule is that of a 40-step run
    r.algo, r.beta, r.failure_cost = "care", 0.0, 0.0  # per arm below
    r.checkpoint_every = 1  # a kill loses at most the step in flight; the same command resumes it
    c.lift.refresh_steps = 0  # the refresh is an arm's start here (prereg.refresh_*), not rl_lift's lift section
    p = c.prereg = ml_collections.ConfigDict()
    p.results = "docs/prereg/rl"  # committed: one record per finished arm (relative to the repository root)
    p.starter = "starter"  # the shipped starter planner (relative to the repository root)
    p.eval_tasks = 0  # 0 = all 600 tasks of the pre-registered list, in list order
    p.refresh_steps, p.refresh_lr, p.refresh_worlds, p.refresh_per_template = 300, 1e-4, 1024, 4
    p.arms = [
        _arm("care-s0", "starter", "care", 0),
        _arm("vanilla-s0", "starter", "vanilla", 0),
        _arm("start", "starter", "none", 0),
        _arm("care-s1", "starter", "care", 1),
        _arm("vanilla-s1", "starter", "vanilla", 1),
        _arm("care-s2", "starter", "care", 2),
        _arm("vanilla-s2", "starter", "vanilla", 2),
        _arm("care+beta-s0", "starter", "care", 0, beta=0.5),
        _arm("care+failure-s0", "starter", "care", 0, failure_cost=1.0),
        _arm("refresh", "refresh", "none", 0),
        _arm("care-refresh-s0", "refresh", "care", 0),
        _arm("vanilla-refresh-s0", "refresh", "vanilla", 0),
    ]
    return c
