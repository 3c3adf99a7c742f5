"""Which tokenizer a run uses, and the check that it fits the model.

A run that starts from a pretrained checkpoint (`config.model.init_from`) must use that checkpoint's
tokenizer: the embedding rows mean that vocabulary's ids and nothing else. So the order is

1. `config.tokenizer.path` when set (e.g. the tokenizer of a checkpoint that ships it separately);
2. the `config.model.init_from` directory itself (HF checkpoints carry tokenizer.json beside the weights);
   a checkpoint without one is an error, never a silently built BPE;
3. only for from-scratch models: the project BPE, built once into `<workdir>/tokenizer`.

A new project BPE for a pretrained checkpoint is built only when asked for by name:
`config.tokenizer.path = "project-bpe"` (its size must still fit the checkpoint's embedding).

Whatever is chosen is then checked against the model's embedding (`check_tokenizer_fits`): every id
below the model's vocabulary size and the chat-format special tokens present. No jax here.
"""
from __future__ import annotations

import json
import os
from typing import Any

from mpa_jax.tokenizer.build import is_tokenizer_dir
from mpa_jax.tokenizer.core import IM_END, IM_START, Tokenizer, TokenizerError, load_tokenizer

# The tokens the project's chat format and tool-call parsing cannot do without.
REQUIRED_TOKENS = (IM_START, IM_END, "<tool_call>", "</tool_call>")
# `config.tokenizer.path` naming the project BPE explicitly (built into <workdir>/tokenizer even with init_from).
PROJECT_BPE = "project-bpe"


def _tokenizer_path(config: Any) -> str:
    """`config.tokenizer.path` ('' for a config without a tokenizer section)."""
    return str(config.tokenizer.path or "") if "tokenizer" in config else ""


def init_from(config: Any) -> str:
    """`config.model.init_from` expanded, or '' for a from-scratch model."""
    path = str(config.model.init_from or "") if "model" in config else ""
    return os.path.expanduser(path) if path else ""


def model_vocab_size(config: Any) -> int | None:
    """Embedding rows of the model a config trains: the init_from checkpoint's config.json vocab_size
    (text_config for multimodal checkpoints), else `config.model.vocab_size`; None for a config without
    a model section (tokenizer-only tools)."""
    if "model" not in config:
        return None
    src = init_from(config)
    if not src:
        return int(config.model.vocab_size)
    if not os.path.isdir(src):
        raise TokenizerError(f"no checkpoint at {src} (config.model.init_from)")
    path = os.path.join(src, "config.json")
    if not os.path.isfile(path):
        raise TokenizerError(f"config.model.init_from={src} has no config.json")
    with open(path, encoding="utf-8") as f:
        hf = json.load(f)
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
    if "vocab_size" not in text:
        raise TokenizerError(f"{path} has no vocab_size")
    return int(text["vocab_size"])


def tokenizer_dir_for_config(config: Any, workdir: str | None) -> str | None:
    """The tokenizer directory a run uses (see the module doc), or None when the project BPE is not
    built yet. Raises TokenizerError when init_from is set but carries no tokenizer and no
    `tokenizer.path` is given."""
    path = _tokenizer_path(config)
    if path == PROJECT_BPE:
        return os.path.join(workdir, "tokenizer") if workdir and is_tokenizer_dir(os.path.join(workdir, "tokenizer")) else None
    if path:
        return os.path.expanduser(path)
    src = init_from(config)
    if src:
        if not os.path.isdir(src):
            raise TokenizerError(f"no checkpoint at {src} (config.model.init_from)")
        if not is_tokenizer_dir(src):
            raise TokenizerError(
                f"config.model.init_from={src} has no tokenizer.json: set config.tokenizer.path to the"
                " checkpoint's tokenizer directory (a project BPE would give the pretrained embedding other ids)"
            )
        return src
    if workdir and is_tokenizer_dir(os.path.join(workdir, "tokenizer")):
        return os.path.join(workdir, "tokenizer")
    return None


def check_tokenizer_fits(tok: Tokenizer, vocab_size: int, where: str = "the model") -> None:
    """Raise TokenizerError (one sentence) unless every id of `tok` has an embedding row among
    `vocab_size` and the chat-format special tokens exist."""
    if tok.vocab_size > vocab_size:
        raise TokenizerError(
            f"the tokenizer has {tok.vocab_size} ids but {where} has {vocab_size} embedding rows:"
            " use the tokenizer the model was trained with (config.tokenizer.path / the init_from directory)"
        )
    missing = [t for t in REQUIRED_TOKENS if t not in tok.backend.get_vocab(with_added_tokens=True)]
    if missing:
        raise TokenizerError(f"the tokenizer lacks the chat-format tokens {missing} that {where}'s chat format needs")


def tokenizer_for_config(config: Any, workdir: str) -> Tokenizer:
    """The run's tokenizer (tokenizer.path, else the init_from checkpoint's, else the project BPE built
    once into `<workdir>/tokenizer`), checked to fit the model's embedding."""
    from mpa_jax.tokenizer.corpus import project_tokenizer

    src = init_from(config)
    named_bpe = _tokenizer_path(config) == PROJECT_BPE
    path = None if named_bpe else tokenizer_dir_for_config(config, None)
    tok = load_tokenizer(path) if path else project_tokenizer(config, workdir)
    vocab = model_vocab_size(config)
    if vocab is not None:
        check_tokenizer_fits(tok, vocab, f"config.model.init_from={src}" if src else "config.model")
    return tok


def tokenizer_for_sections(*, tokenizer: Any, model: Any, context: Any, oracle: Any, seed: int, workdir: str) -> Tokenizer:
    """`tokenizer_for_config` from the config sections it reads: `tokenizer`, `model` (init_from, vocab_size),
    and for a project BPE built here `context`, `oracle` (the corpus split) and the seed. The RL trainer passes
    these, not the whole config."""
    import ml_collections

    view = ml_collections.ConfigDict({"tokenizer": tokenizer, "model": model, "context": context, "oracle": oracle, "seed": int(seed)})
    return tokenizer_for_config(view, workdir)


__all__ = ["PROJECT_BPE", "REQUIRED_TOKENS", "check_tokenizer_fits", "init_from", "model_vocab_size", "tokenizer_dir_for_config", "tokenizer_for_config"]
