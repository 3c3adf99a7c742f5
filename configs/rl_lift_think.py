"""CARE vs vanilla on a start that reasons (issue 28 item 3): configs/rl_lift.py with the settings the 4.2M planner needs
for CARE's length term to have something to cut and to act on it.

    mpa experiment rl-lift --config configs/rl_lift_think.py --init starter --seeds 2 --algos care,vanilla --eval-every 20 --until 20 --workdir runs/rl_lift_think

- a world-general refresh of the starter on demonstrations with the oracle's `<think>` sentences (300 SFT steps, 1,024
  worlds of no split; ~62 tokens of reasoning per episode for RL to price), then RL on fresh instances in 256 worlds;
- CARE's length term engaged at this start's competence (~0.4): lambda 0 at competence 0 up to lambda_max 1 at 0.5 (the
  recipe's schedule, up to 0.5 over competence 0.3 -> 0.8, averaged lambda 0.11 here). The vanilla arm ignores these keys (lambda 0, beta 0).

Both arms of a seed share the refresh, the seeds' tasks and the evaluation; one workdir holds them all, and the command
above resumes and regenerates `table.md` and `rl_lift.png`. Measured at step 20, 2 seeds: CARE 47.2% vs vanilla 42.4%,
output tokens -13.5% (docs/experiments.md "A start that reasons"); a sharper cost squash
(--config.rl.cost_sharpness=3.0 --config.rl.c_hi=0.25): 46.9% vs 42.4%, -17.3% at step 20 (2 seeds), but seed 0 at step
40 only -5.6% at equal accuracy (failures whose turns loop up to the 128-token cap; no reward here prices them). Adding
an opt-in price on failures' length (--config.rl.failure_cost=1.0, beyond DESIGN §6; mpa_jax/rl/care.py): 49.3% vs
42.4%, -23.3% at step 20 (2 seeds), 54.2% vs 46.9%, -26.8% at step 40 (2 seeds; docs/experiments.md "Both seeds to
step 40", whose command regenerates that table); twice that (failure_cost=2.0) does worse on both counts: 34.7%, -13.2% at step 20.
Those figures predate issue 50 (beta 0.5 on, group-std-normalised length advantages, a per-template EMA competence
that sat near 0.5, vanilla arms that kept fewer groups); the pre-registered-test issue re-measures them on this code.
"""
import os

from mpa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "rl_lift.py"))
    c.name = "rl_lift_think"
    c.context.reasoning = "full"
    c.lift.refresh_steps = 300
    c.rl.select_worlds = 256
    c.rl.lambda_max, c.rl.c_lo, c.rl.c_hi = 1.0, 0.0, 0.5
    return c
