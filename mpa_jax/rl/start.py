"""Starting an RL run: the config checks and the initial weights (`--init`: an HF directory or an orbax run)."""
from __future__ import annotations

import os
from typing import Any

from mpa_jax.rl import care
from mpa_jax.rl.errors import RLSetupError


def load_init(model: Any, init: str | None, workdir: str) -> tuple[Any, Any, str | None]:
    """(model config, host params or None for random init, HF dir) from --init (HF dir or orbax run/checkpoint),
    else `model.init_from` (the `config.model` section), else random weights of `model`'s shape."""
    import jax

    from mpa_jax import models
    from mpa_jax.train import checkpoint as ckpt

    init = init or str(model.init_from) or None
    if not init:
        return models.config_from_ml(model), None, None
    if not os.path.isdir(init):
        raise RLSetupError(f"--init {init} is not a directory")
    hf_dir = init
    # A run directory also holds a config.json (the resolved experiment config): weights decide.
    if not any(f.endswith(".safetensors") or f.endswith(".safetensors.index.json") for f in os.listdir(init)):
        from mpa_jax.export import export_checkpoint

        try:
            ckpt.find_step_dir(init)
        except ckpt.CheckpointError as e:
            raise RLSetupError(f"--init {init} is neither an HF directory (safetensors) nor an orbax checkpoint: {e}") from None
        tok_dir = next((d for d in (os.path.join(init, "tokenizer"), os.path.join(os.path.dirname(os.path.abspath(init)), "tokenizer"))
                        if os.path.isdir(d)), None)
        hf_dir = export_checkpoint(init, os.path.join(workdir, "init_hf"), dtype="float32", tokenizer_dir=tok_dir)
    loaded = models.from_pretrained(hf_dir, dtype=str(model.param_dtype))
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
