"""Co-evolution against model-only (issue 53, item 3): the demo's loop run twice from the shipped starter.

    mpa experiment coevolution --config configs/prereg_coevo.py --workdir runs/coevo          # both arms (resumes)
    mpa experiment coevolution --config configs/prereg_coevo.py --table                       # the per-round table

What it is for: to test the claim that alternating model training with harness refinement beats model training
alone. Both arms are configs/tiny.py's closed loop (the demo's) from the same start, seed and budget
(`loop.rounds` rounds of RL + SFT refresh + data); the co-evolution arm also mines, reviews and releases harness
versions each round, the model-only arm keeps the harness at its initial version (`mpa_jax/experiments/coevolution.py`).
Every stage is evaluated on the loop's evaluation tasks: the pre-registered test set's demo subset (32 seen + 16
held-out templates; `--config.loop.eval_seen=300 --config.loop.eval_held_out=300` for all 600). Records (one per
finished arm) go to `coevolution.results`. Results: docs/preregistered.md.
"""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny.py"))
    c.name = "prereg_coevo"
    c.loop.rounds = 2
    c.coevolution = ml_collections.ConfigDict()
    c.coevolution.starter = "starter"  # the shipped starter planner; "" = from scratch
    c.coevolution.results = "docs/prereg/coevolution"  # committed: one record per finished arm (relative to the repo root)
    return c
