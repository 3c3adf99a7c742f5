"""Rollout: sampler engines, the multi-turn agent loop, the SGLang client and `mpa serve`.

Public API::

    from mpa_jax import rollout
    rollout.SamplingParams(max_new_tokens, temperature, top_p, top_k, stop_token_ids, seed)
    rollout.RolloutEngine                      # protocol: generate(prompts, params, seeds) -> [GenerateResult],
                                               #           update_weights(params_or_hf_dir, version), weight_version
    rollout.Engine(cfg, params, mesh=None, rules=None, max_batch=16, vocab_limit=None)   # embedded sampler (imports jax)
    engine.generate_rows(prompts, [SamplingParams per prompt], seeds, top_logprobs=0)     # mixed settings, one batch
    rollout.Engine.from_pretrained(hf_dir)
    rollout.SGLangEngine(base_url, ...)        # SGLang 0.5.x native-API client (also talks to `mpa serve`)
    rollout.hf_exporter(cfg, tokenizer_dir)    # exporter= for SGLangEngine.update_weights(params, version)
    rollout.make_engine(config, checkpoint=None, params=None, tokenizer=tok) -> engine   # from the `c.rollout`
                                               # config; never samples an id >= tokenizer.vocab_size
    rollout.EpisodeRunner.from_config(config)  # envs (kind or mixture), pool, harness, context format
    runner.run(engine, tokenizer, tasks, rollout.EpisodeConfig.defaults(...)) -> [Trajectory]
    rollout.create_app(engine, tokenizer) / rollout.ServerThread(app)    # `mpa serve` (FastAPI): SGLang-native + OpenAI
    rollout.sglang_launch_command(hf_dir, ...)  # `python -m sglang.launch_server ...` argv

Importing this package does not import jax; `Engine` and `make_engine` load it on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from mpa_jax.rollout.types import EngineError, GenerateResult, RolloutEngine, SamplingParams  # noqa: F401

_LAZY = {
    "Engine": "mpa_jax.rollout.jax_engine",
    "SGLangEngine": "mpa_jax.rollout.sglang",
    "hf_exporter": "mpa_jax.export_sync",
    "EpisodeConfig": "mpa_jax.rollout.runner",
    "EpisodeRunner": "mpa_jax.rollout.runner",
    "make_engine": "mpa_jax.rollout.engines",
    "create_app": "mpa_jax.rollout.server",
    "ServerThread": "mpa_jax.rollout.server",
    "sglang_launch_command": "mpa_jax.rollout.launch",
}

__all__ = ["EngineError", "GenerateResult", "RolloutEngine", "SamplingParams", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mpa_jax.rollout' has no attribute {name!r}")
