"""Engines from the config: the one `make_engine`, and the checks that an engine fits its tokenizer.

    engine = make_engine(config, "runs/x/hf", tokenizer=tok)              # an exported checkpoint
    engine = make_engine(config, params=p, model_cfg=cfg, tokenizer=tok)  # live weights (RL, the SFT hook)
    engine = make_engine(config, tokenizer=tok)                            # the config's model, untrained

`config.rollout.engine` picks the embedded JAX engine or the SGLang client; the vocabulary rule (ids the
tokenizer cannot produce are never sampled) holds for both.
"""
from __future__ import annotations

import os
from typing import Any

from mpa_jax.rollout.types import RolloutEngine


class RolloutSetupError(ValueError):
    """A checkpoint, tokenizer or config does not fit the rollout; the message names it."""


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def make_engine(
    config: Any,
    checkpoint: str | None = None,
    *,
    params: Any = None,
    model_cfg: Any = None,
    version: str = "init",
    tokenizer: Any = None,
    vocab_limit: int | None = None,
    tokenizer_dir: str | None = None,
    export_root: str | None = None,
    workdir: str | None = None,
) -> RolloutEngine:
    """The engine `config.rollout.engine` names ("jax" or "sglang"), with weights from one of:

    - `checkpoint`: an exported HF directory;
    - `params` (+ `model_cfg`): live weights, e.g. the learner's (the engine keeps its own copy, labelled
      `version`); for SGLang they are exported (`tokenizer_dir` beside them, under `export_root`) and
      loaded by the server(s);
    - neither: the config's model with random weights (seed `config.seed`; the untrained baseline).

    jax: with `config.rollout.sharded`, parameters are placed on the mesh of `config.mesh`; otherwise
    `config.rollout.replicas` weight copies over the local devices. sglang: a client for
    `config.rollout.sglang_url`.

    Compilation cache: with `config.rollout.compilation_cache`, the embedded engine's programs are kept
    under `<workdir>/xla_cache` (`workdir`, else the directory above `export_root`: RL's run directory),
    so a resumed or repeated run loads them instead of compiling; without a workdir, nothing is written.

    The vocabulary rule: ids the tokenizer cannot produce are never sampled. Pass the `tokenizer`
    (its `vocab_size` becomes the engine's `vocab_limit`) or `vocab_limit` itself; a tokenizer larger
    than the model's embedding is a RolloutSetupError here. With neither, every id may be sampled.
    """
    if tokenizer is not None:
        tok_size = int(tokenizer.vocab_size)
        if vocab_limit is not None and int(vocab_limit) != tok_size:
            raise RolloutSetupError(f"make_engine: vocab_limit {vocab_limit} differs from the tokenizer's {tok_size} ids")
        vocab_limit = tok_size
    if params is not None and model_cfg is None:
        raise RolloutSetupError("make_engine: params need their model_cfg")
    kind = str(config.rollout.engine)
    if checkpoint is not None and not os.path.isdir(checkpoint):
        raise RolloutSetupError(f"checkpoint {checkpoint} is not a directory")
    if checkpoint is not None and not _is_hf_dir(checkpoint):
        raise RolloutSetupError(
            f"checkpoint {checkpoint} is not an exported Hugging Face directory (no config.json); run `mpa export` on it first"
        )
    if kind == "sglang":
        from mpa_jax.export_sync import hf_exporter
        from mpa_jax.rollout.sglang import engine_from_config

        exporter = None
        if model_cfg is not None:
            # exported in the learner's parameter dtype (the exporter's default is bfloat16): the server loads
            # exactly the learner's weights (it may still cast them to its own --dtype)
            exporter = hf_exporter(model_cfg, tokenizer_dir, dtype=str(model_cfg.param_dtype))
        try:
            engine = engine_from_config(config, vocab_limit=vocab_limit, exporter=exporter, export_root=export_root)
        except ValueError as e:  # a bad config.rollout.sglang_* value, named
            raise RolloutSetupError(str(e)) from None
        if params is not None:
            import jax

            engine.update_weights(jax.device_get(params), str(version))
        elif checkpoint is not None:
            engine.update_weights(os.path.abspath(checkpoint), os.path.basename(os.path.normpath(checkpoint)))
        return engine
    if kind != "jax":
        raise RolloutSetupError(f"config.rollout.engine must be 'jax' or 'sglang', got {kind!r}")
    import jax

    from mpa_jax import models
    from mpa_jax.rollout.engine import Engine, check_vocab_limit
    from mpa_jax.rollout.types import EngineError

    run_dir = workdir or (os.path.dirname(os.path.normpath(export_root)) if export_root else None)
    if run_dir and bool(config.rollout.compilation_cache):
        from mpa_jax.rollout.engine.compiles import persistent_cache

        persistent_cache(run_dir)
    mesh = rules = None
    if config.rollout.sharded:
        from mpa_jax import sharding

        mesh = sharding.make_learner_mesh(config.mesh)  # the learner's devices (a 1-device mesh: the first)
        rules = sharding.rules_from_config(config)
    # slots as long as an episode may grow (rollout.max_total_tokens): a longer ring only costs memory
    kw = dict(mesh=mesh, rules=rules, max_batch=int(config.rollout.batch_size), replicas=engine_replicas(config, mesh),
              vocab_limit=None if vocab_limit is None else int(vocab_limit), slot_len=int(config.rollout.max_total_tokens),
              prefill_chunk=int(config.rollout.prefill_chunk), prefix_cache=bool(config.rollout.prefix_cache))
    compute = str(config.rollout.compute_dtype)  # "": the model's
    if checkpoint is not None:
        try:
            return Engine.from_pretrained(checkpoint, dtype=str(config.model.param_dtype), compute_dtype=compute or None, **kw)
        except EngineError as e:
            raise RolloutSetupError(f"checkpoint {checkpoint}: {e}") from None
        except ValueError as e:  # hf_io.CheckpointError and config errors name the file or tensor
            raise RolloutSetupError(f"cannot load checkpoint {checkpoint}: {e}") from None
    cfg = model_cfg if model_cfg is not None else models.config_from_ml(config.model)
    if compute:
        cfg = cfg.replace(compute_dtype=compute)
    try:
        check_vocab_limit(kw["vocab_limit"], cfg.vocab_size)
    except EngineError as e:
        raise RolloutSetupError(f"config.model: {e}") from None
    if params is not None:
        return Engine(cfg, params, weight_version=str(version), **kw)  # the engine keeps its own copy
    params = models.init_params(cfg, jax.random.key(int(config.seed)), mesh=mesh, rules=rules)
    return Engine(cfg, params, weight_version="init", **kw)


def engine_for_weights(rollout: Any, *, mesh: Any, rules: Any, serve: Any, params: Any, model_cfg: Any, version: str,
                       tokenizer: Any = None, tokenizer_dir: str | None = None, export_root: str | None = None) -> RolloutEngine:
    """`make_engine` for live weights (the RL learner's) from the config sections it reads: `rollout`, `mesh` and
    the sharding `rules` (with `rollout.sharded`), `serve` (the SGLang servers' api key). The RL trainer passes
    these, not the whole config."""
    import ml_collections

    view = ml_collections.ConfigDict({"rollout": rollout, "mesh": mesh, "sharding_rules": tuple(rules), "serve": serve})
    return make_engine(view, params=params, model_cfg=model_cfg, version=version, tokenizer=tokenizer,
                       tokenizer_dir=tokenizer_dir, export_root=export_root)


def check_engine_vocab(engine: Any, tokenizer: Any) -> None:
    """RolloutSetupError unless an engine samples exactly the tokenizer's ids (its `vocab_limit`).

    An engine without a `vocab_limit` attribute (a remote server) is not checked here; its client
    turns ids outside the tokenizer into an EngineError instead.
    """
    limit = getattr(engine, "vocab_limit", None)
    if limit is None:
        return
    size = int(tokenizer.vocab_size)
    model_vocab = getattr(getattr(engine, "cfg", None), "vocab_size", limit)
    if size > model_vocab:
        raise RolloutSetupError(
            f"tokenizer has {size} ids but the model's vocabulary is {model_vocab}; they must come from the same run"
        )
    if int(limit) != size:
        raise RolloutSetupError(
            f"the engine samples ids below {limit} but the tokenizer has {size}; build the engine with"
            f" vocab_limit={size} (make_engine(..., tokenizer=tok)) so that it never samples an id the tokenizer cannot decode"
        )


def engine_replicas(config: Any, mesh: Any = None) -> int:
    """Weight replicas of the embedded engine from `config.rollout.replicas`.

    0 (auto): on a CPU host one per core this process may run on, up to the XLA host devices
    (`--xla_force_host_platform_device_count`); 1 on accelerators (use `rollout.sharded` and the mesh
    there) and with a mesh. An explicit count must not exceed the local devices.
    """
    import jax

    n = int(config.rollout.replicas)
    if mesh is not None:
        if n > 1:
            raise RolloutSetupError(f"config.rollout.replicas={n} cannot be combined with rollout.sharded (a mesh)")
        return 1
    if n < 0 or n > jax.local_device_count():
        raise RolloutSetupError(
            f"config.rollout.replicas={n}: must be 0 (auto) or 1..{jax.local_device_count()} (the local devices)"
        )
    if n:
        return n
    if jax.default_backend() != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(jax.local_device_count(), cores))


def load_rollout_tokenizer(config: Any, checkpoint: str | None, workdir: str | None) -> Any:
    """The checkpoint's own tokenizer when it carries one, else the config's (`tokenizer_for_config`)."""
    from mpa_jax import tokenizer as tk

    if checkpoint is not None and tk.is_tokenizer_dir(checkpoint):
        return tk.load_tokenizer(checkpoint)
    return tk.tokenizer_for_config(config, workdir or os.path.join("runs", str(config.name)))
