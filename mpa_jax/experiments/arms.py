"""What both RL experiments share: the start, fitted as every command fits one, and each arm's run directory.

    config = fitted(config, init, workdir)               # init: a start, or None when the config names one already
    cfg = arm_config(config, "vanilla", seed=1)          # rl.algo and the seed change, nothing else
    prepare_arm(cfg, run_dir, recipe)                    # its resolved config and card, before it trains

An arm's directory carries the config that ran (`config.json`) and a card with its tokenizer (`mpa_jax.card`),
so it is itself a start for `mpa eval --checkpoint` / `mpa rl --checkpoint`.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping


def fitted(config: Any, init: str | None, workdir: str) -> Any:
    """`config` fitted to the start `init` (`mpa_jax.start.fit_start`: its shape, tokenizer, context format and
    positions; a run directory exported once under `workdir`), or `config` as it is when `init` is None (the CLI's
    `--checkpoint` fitted it already: `config.model.init_from` is the start's HF directory)."""
    if not init:
        return config
    from mpa_jax.start import fit_start

    return fit_start(config, init, workdir=workdir)[0]


def arm_config(config: Any, algo: str, seed: int) -> Any:
    """An arm's config: `rl.algo` and the seed change, nothing else. The vanilla arm keeps the lambda schedule (its
    advantages ignore it) because the matched-arms rule keeps a group by CARE's reward or vanilla's in both arms."""
    cfg = copy.deepcopy(config)
    cfg.rl.algo, cfg.seed = algo, seed
    return cfg


def prepare_arm(cfg: Any, run_dir: str, recipe: Mapping[str, Any] | None = None) -> None:
    """Write the arm's resolved config and its card (tokenizer copied in) into `run_dir` before it trains; `recipe`:
    what ran the experiment (`command`, `config_file`, and `start`, the start as named; default the fitted
    `config.model.init_from`)."""
    from mpa_jax.card import stamp_run_dir
    from mpa_jax.config import save_config

    save_config(cfg, run_dir)
    recipe = dict(recipe or {})
    stamp_run_dir(run_dir, cfg, stage="rl", command=recipe.get("command"), config_file=recipe.get("config_file"),
                  start=recipe.get("start") or str(cfg.model.init_from) or None)
