"""BFCL v4 multi-turn (`bfcl-eval==2026.3.23`) as the `bfcl` env kind: tasks, tools, backends and checker are
BFCL's own (`envs/bfcl/data.py`: data and the class -> domain mapping; `envs/bfcl/env.py`: the env).

The wheel is installed without its declared dependencies (they pin numpy==1.26.4): `make install-bench`,
i.e. `pip install --no-deps bfcl-eval==2026.3.23 && pip install filelock mpmath`. Importing this package does
not import bfcl_eval.
"""
from mpa_jax.envs.bfcl.data import CATEGORIES, CLASS_DOMAINS, BfclUnavailable, make_tasks, scenario_splits  # noqa: F401
from mpa_jax.envs.bfcl.env import BfclEnv  # noqa: F401
