"""Checkpoint cards: what using a checkpoint needs, written next to its weights.

Every checkpoint the project writes carries `mpa_checkpoint.json`: tokenizer, chat template, context
format, positions, model config and the recipe that made it (docs/checkpoints.md). A starter directory's
`datasheet.json` (written before cards existed) is read as a card too. `mpa_jax.start` resolves starts
from these; `mpa_jax.export` writes them. No jax at import time, and nothing here imports `start` or
`export` (they both import this).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Mapping

from mpa_jax.files import write_json

CARD = "mpa_checkpoint.json"
CARD_VERSION = 1


class StartError(ValueError):
    """A start cannot be resolved or does not fit the config; the message names what to do."""


# The config sections that decide the starter's weights (others - serve, rl, rollout - do not).
RECIPE_SECTIONS = ("model", "tokenizer", "tasks", "oracle", "sft", "context")
RECIPE_TOP = ("seed",)
# Recipe keys that only move files around or change logging, not the weights.
NOT_RECIPE = {"sft.data", "sft.export", "sft.export_dtype", "sft.log_every", "sft.peak_flops", "tokenizer.path",
              "model.init_from", "sft.eval_every", "sft.eval_batches"}
def recipe_values(config: Any) -> dict[str, Any]:
    """The flattened recipe: `section.key` -> value for RECIPE_SECTIONS (tuples as lists, JSON-ready)."""
    out: dict[str, Any] = {k: config.get(k) for k in RECIPE_TOP}
    for section in RECIPE_SECTIONS:
        sec = config.get(section, None)
        if sec is None:
            continue
        for key, value in sec.to_dict().items():
            name = f"{section}.{key}"
            if name not in NOT_RECIPE:
                out[name] = list(value) if isinstance(value, tuple) else value
    return out


def recipe_hash(values: Mapping[str, Any]) -> str:
    """sha256 (16 hex) of the recipe values in canonical JSON."""
    blob = json.dumps(dict(values), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise StartError(f"{path} is unreadable: {e}") from None
    if not isinstance(data, dict):
        raise StartError(f"{path} is not a JSON object")
    return data


def _text_config(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of an HF config (multimodal checkpoints nest it in text_config)."""
    return hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        f.endswith(".safetensors") or f.endswith(".safetensors.index.json") for f in os.listdir(path))


def _is_tokenizer_dir(path: str | None) -> bool:
    from mpa_jax.tokenizer.build import is_tokenizer_dir

    return bool(path) and is_tokenizer_dir(str(path))


def _card_from_datasheet(sheet: Mapping[str, Any]) -> dict[str, Any]:
    """A starter datasheet (written before cards existed) read as a card."""
    card: dict[str, Any] = {"recipe": {"command": sheet.get("command"), "config": "starter",
                                       "recipe_hash": sheet.get("recipe_hash")}}
    if isinstance(sheet.get("context"), dict):
        card["context"] = dict(sheet["context"])
    return card


def make_card(config: Any, *, kind: str, stage: str, tokenizer: str | None, chat_template: str | None,
              command: str | None = None, config_file: str | None = None, start: str | None = None) -> dict[str, Any]:
    """The card of a checkpoint made with `config` (the resolved config that ran).

    Fields: `mpa_checkpoint` (card version), `kind` ("hf" | "run"), `stage` (sft, rl, export, starter,
    loop), `model` (the HF config.json dict), `max_positions`, `vocab_size` (embedding rows),
    `tokenizer` (directory with tokenizer.json, relative to the card; None when it carries none),
    `chat_template` (file relative to the card, or None), `context` ({"format", "reasoning"}), `recipe`
    ({"command", "config", "config_file", "start", "recipe_hash"}). No timestamp: the same run exports the
    same bytes.
    """
    from mpa_jax import models
    from mpa_jax.envs.context import ContextFormat

    cfg, _ = models.run_model_config(config)
    hf = cfg.to_hf()
    return {
        "mpa_checkpoint": CARD_VERSION,
        "kind": kind,
        "stage": stage,
        "model": hf,
        "max_positions": int(cfg.max_position_embeddings),
        "vocab_size": int(cfg.vocab_size),
        "tokenizer": tokenizer,
        "chat_template": chat_template,
        "context": ContextFormat.from_config(config).to_dict(),
        "recipe": {"command": command, "config": str(config.name), "config_file": config_file,
                   "start": start, "recipe_hash": recipe_hash(recipe_values(config))},
    }


def _chat_template_in(directory: str) -> str | None:
    return "chat_template.jinja" if os.path.isfile(os.path.join(directory, "chat_template.jinja")) else None


def write_hf_card(hf_dir: str, config: Any, *, stage: str, command: str | None = None, config_file: str | None = None,
                  start: str | None = None) -> str:
    """Write the card of an exported HF directory (its tokenizer is the directory itself); returns its path."""
    tok = "." if _is_tokenizer_dir(hf_dir) else None
    card = make_card(config, kind="hf", stage=stage, tokenizer=tok, chat_template=_chat_template_in(hf_dir),
                     command=command, config_file=config_file, start=start)
    path = os.path.join(hf_dir, CARD)
    write_json(path, card, default=str)
    return path


def stamp_run_dir(workdir: str, config: Any, *, stage: str, command: str | None = None, config_file: str | None = None,
                  start: str | None = None) -> str:
    """Make an orbax run directory self-describing: copy the run's tokenizer into `<workdir>/tokenizer`
    when it lives elsewhere (tokenizer.path or the init_from checkpoint) and write the card. Call it
    before training starts, so an interrupted run is a start too. Returns the card's path."""
    from mpa_jax.tokenizer.select import tokenizer_dir_for_config

    os.makedirs(workdir, exist_ok=True)
    own = os.path.join(workdir, "tokenizer")
    src = tokenizer_dir_for_config(config, workdir)
    if src and _is_tokenizer_dir(src) and os.path.abspath(src) != os.path.abspath(own):
        os.makedirs(own, exist_ok=True)
        from mpa_jax.models.hf_io import _TOKENIZER_FILES

        for fname in sorted(os.listdir(src)):
            if fname in _TOKENIZER_FILES or fname.endswith((".jinja", ".tiktoken")):
                shutil.copy2(os.path.join(src, fname), os.path.join(own, fname))
    tok = "tokenizer" if _is_tokenizer_dir(own) else None
    card = make_card(config, kind="run", stage=stage, tokenizer=tok,
                     chat_template="tokenizer/chat_template.jinja" if tok and _chat_template_in(own) else None,
                     command=command, config_file=config_file, start=start)
    path = os.path.join(workdir, CARD)
    write_json(path, card, default=str)
    return path


def _nearest_record(run_dir: str) -> tuple[dict[str, Any], Any]:
    """(card, saved config or None) of the run owning a checkpoint: the nearest directory at or above
    `run_dir` (3 levels: loop stages sit under the loop's workdir) with a card or a saved config.json."""
    import ml_collections

    d = os.path.abspath(run_dir)
    for _ in range(4):
        if os.path.isfile(os.path.join(d, CARD)):
            return _read_json(os.path.join(d, CARD)), None
        saved = os.path.join(d, "config.json")
        if os.path.isfile(saved) and not _is_hf_dir(d):
            data = _read_json(saved)
            if "model" in data and "context" in data:  # an experiment config the CLI saved, not an HF config.json
                return {}, ml_collections.ConfigDict(data)
        d = os.path.dirname(d)
    return {}, None


def card_for_export(run_dir: str, out_dir: str, model_hf: Mapping[str, Any], step_dir: str) -> dict[str, Any]:
    """The card of an HF directory exported from a run's checkpoint: the model as saved, the files in
    `out_dir`, and the context format and recipe of the run (its card, else the config the CLI saved
    for it; absent when neither exists)."""
    from mpa_jax.envs.context import ContextFormat

    card, saved = _nearest_record(run_dir)
    out = {k: v for k, v in card.items() if k in ("stage", "context", "recipe")}
    if not card and saved is not None:
        out["context"] = ContextFormat.from_config(saved).to_dict()
        out["recipe"] = {"command": None, "config": str(saved.get("name", "")), "config_file": None,
                         "start": str(saved.model.get("init_from", "") or "") or None, "recipe_hash": None}
    text = _text_config(model_hf)
    out.update({
        "mpa_checkpoint": CARD_VERSION,
        "kind": "hf",
        "model": dict(model_hf),
        "max_positions": int(text["max_position_embeddings"]),
        "vocab_size": int(text["vocab_size"]),
        "tokenizer": "." if _is_tokenizer_dir(out_dir) else None,
        "chat_template": _chat_template_in(out_dir),
        "exported_from": os.path.abspath(step_dir),
    })
    out.setdefault("stage", "export")
    return out


def read_card(directory: str) -> dict[str, Any]:
    """The card of a checkpoint directory ({} when it has none; a starter's datasheet is read as one)."""
    if os.path.isfile(os.path.join(directory, CARD)):
        return _read_json(os.path.join(directory, CARD))
    if os.path.isfile(os.path.join(directory, "datasheet.json")):
        return _card_from_datasheet(_read_json(os.path.join(directory, "datasheet.json")))
    return {}
