"""Starting an RL run: the config checks and the start's weights (`model.init_from`, fitted by `mpa_jax.start`)."""
from __future__ import annotations

import os
from typing import Any

from mpa_jax.rl import care
from mpa_jax.rl.errors import RLSetupError


def load_init(model: Any) -> tuple[Any, Any, str | None]:
    """(model config, host params or None for random init, HF dir) of the `config.model` section: the weights of
    `model.init_from` (an HF directory: a start is fitted to the config first, by `run_rl` or the CLI), else random
    weights of `model`'s shape. The parameter and compute dtypes are the section's."""
    import jax

    from mpa_jax import models

    hf_dir = os.path.expanduser(str(model.init_from))
    if not hf_dir:
        return models.config_from_ml(model), None, None
    try:
        loaded = models.from_pretrained(hf_dir, dtype=str(model.param_dtype))
    except (OSError, ValueError) as e:
        raise RLSetupError(f"config.model.init_from={hf_dir}: {e}") from None
    cfg = loaded.cfg.replace(compute_dtype=str(model.compute_dtype), param_dtype=str(model.param_dtype))
    return cfg, jax.device_get(loaded.params), hf_dir


def check_config(rl: Any, rollout: Any) -> None:
    """One clear error for the first `config.rl` value the loop cannot use (`rollout`: the `config.rollout` section)."""
    care.check_rl_config(rl)
    if bool(rl.async_rollouts) and int(rl.max_staleness) < 1:
        raise RLSetupError(f"config.rl.max_staleness={rl.max_staleness} must be >= 1 with config.rl.async_rollouts=True")
    if int(rl.seq_len) < int(rollout.max_total_tokens):
        raise RLSetupError(f"config.rl.seq_len={rl.seq_len} must be >= config.rollout.max_total_tokens="
                           f"{rollout.max_total_tokens} (no episode may be cut)")
    if not float(rl.temperature) > 0:
        raise RLSetupError(f"config.rl.temperature={rl.temperature} must be > 0")
    if int(rl.max_bad_updates) < 1:
        raise RLSetupError(f"config.rl.max_bad_updates={rl.max_bad_updates} must be >= 1")
