"""Naming a start: the one way every command says which checkpoint it begins from.

    from mpa_jax.start import resolve_start, config_for_start

    start = resolve_start("starter")                # or an HF directory, or an orbax run directory
    config = config_for_start(None, start)          # the default config fitted to it (or pass your own)
    config, start = fit_start(config, "runs/sft")   # both at once (RL runs and experiments given init=)

`resolve_start(path_or_name)` accepts

- a Hugging Face directory (config.json + safetensors; the tokenizer beside the weights);
- an orbax run directory of an SFT / RL run (`checkpoints/<step>/`, `tokenizer/`, the card), its
  `checkpoints/` directory or one step directory (the latest step by default);
- the name `starter`: the shipped starter planner (`<repository>/starter`).

A missing path is one error, "no checkpoint at PATH". `config_for_start(config, start)` returns a copy of
`config` fitted to the checkpoint: the model's shape (config.json), `model.init_from` (an HF directory; a
run directory is exported to one once), `tokenizer.path` (the checkpoint's own tokenizer), the context
format it was trained with, and `rollout.max_total_tokens` no longer than its positions. An obvious fix
is applied and said in one line; a conflict with what the user set explicitly is one StartError naming
the fix. The saved run config is then what actually runs.

Every checkpoint the project writes carries a card, `mpa_checkpoint.json` (`write_card`), next to the
weights: what using it needs (tokenizer, chat template, context format, positions, model config) and
the recipe that made it. A starter directory's `datasheet.json` (written before cards existed) is read
as a card too. No jax at import time.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from typing import Any, Callable, Iterable, Mapping

from mpa_jax.card import (CARD, StartError, _card_from_datasheet, _is_hf_dir, _is_tokenizer_dir, _read_json,
                           _text_config, card_for_export, make_card, read_card, stamp_run_dir, write_hf_card)
from mpa_jax.files import write_json

STARTER_NAME = "starter"
# The run-dir export of a start lands here (under the command's workdir, else the run directory).
START_HF = "start_hf"
_SOURCE = "start_source.json"


def repo_root() -> str:
    """The repository (editable install) root: the directory holding the `mpa_jax` package."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Start:
    """A resolved start.

    `path`: absolute directory named (HF dir, or the run directory of an orbax checkpoint); `kind`:
    "hf" or "run"; `hf_config`: the model's config.json dict; `tokenizer_dir`: the directory holding its
    tokenizer.json (None when it carries none); `card`: its mpa_checkpoint.json ({} for a foreign HF
    checkpoint); `step_dir`: the orbax step directory (run kind only); `name`: a short label.
    """

    path: str
    kind: str
    hf_config: dict[str, Any]
    tokenizer_dir: str | None
    card: dict[str, Any]
    name: str
    step_dir: str | None = None

    @property
    def max_positions(self) -> int:
        """The model's max_position_embeddings."""
        return int(_text_config(self.hf_config)["max_position_embeddings"])

    @property
    def vocab_size(self) -> int:
        """Embedding rows of the model."""
        return int(_text_config(self.hf_config)["vocab_size"])

    @property
    def context(self) -> dict[str, str] | None:
        """The context format it was trained with ({"format", "reasoning"}), None when unknown."""
        ctx = self.card.get("context")
        return dict(ctx) if isinstance(ctx, dict) else None

    def hf_dir(self, cache_dir: str | None = None) -> str:
        """An HF directory with these weights: the start itself, or (run kind) its step exported once,
        in float32 with its tokenizer and card, to `<cache_dir or the run directory>/start_hf`
        (reused while it was exported from the same step)."""
        if self.kind == "hf":
            return self.path
        from mpa_jax.export import export_checkpoint

        out = os.path.join(os.path.abspath(cache_dir) if cache_dir else self.path, START_HF)
        source = {"step_dir": self.step_dir}
        marker = os.path.join(out, _SOURCE)
        if os.path.isfile(marker) and _read_json(marker) == source and _is_hf_dir(out):
            return out
        if os.path.isdir(out):
            shutil.rmtree(out)
        assert self.step_dir is not None
        # into a private directory, then renamed: hosts of a multi-host run may all resolve the same start
        tmp = f"{out}.tmp{os.getpid()}"
        export_checkpoint(self.step_dir, tmp, dtype="float32", tokenizer_dir=self.tokenizer_dir)  # writes the card too
        write_json(os.path.join(tmp, _SOURCE), source)
        try:
            os.rename(tmp, out)
        except OSError:  # another process renamed its identical export first
            shutil.rmtree(tmp, ignore_errors=True)
        return out


def _hf_start(path: str) -> Start:
    hf = _read_json(os.path.join(path, "config.json"))
    if os.path.isfile(os.path.join(path, CARD)):
        card = _read_json(os.path.join(path, CARD))
    elif os.path.isfile(os.path.join(path, "datasheet.json")):
        card = _card_from_datasheet(_read_json(os.path.join(path, "datasheet.json")))
    else:
        card = {}
    tok = path if _is_tokenizer_dir(path) else None
    return Start(path, "hf", hf, tok, card, os.path.basename(path))


def _run_tokenizer(run_dir: str, card: Mapping[str, Any]) -> str | None:
    """A run's tokenizer: the card's, else `<run>/tokenizer`, else (runs made before cards) the one its
    saved config names (tokenizer.path, else model.init_from)."""
    named = card.get("tokenizer")
    if isinstance(named, str) and _is_tokenizer_dir(os.path.join(run_dir, named)):
        return os.path.normpath(os.path.join(run_dir, named))
    if _is_tokenizer_dir(os.path.join(run_dir, "tokenizer")):
        return os.path.join(run_dir, "tokenizer")
    saved = os.path.join(run_dir, "config.json")
    if os.path.isfile(saved):
        cfg = _read_json(saved)
        for section, key in (("tokenizer", "path"), ("model", "init_from")):
            cand = str((cfg.get(section) or {}).get(key) or "")
            if cand and _is_tokenizer_dir(os.path.expanduser(cand)):
                return os.path.abspath(os.path.expanduser(cand))
    return None


def _run_start(path: str) -> Start:
    from mpa_jax.export import _read_meta
    from mpa_jax.train.checkpoint import CheckpointError, find_step_dir

    try:
        root, step = find_step_dir(path)
        meta = _read_meta(root, step)
    except CheckpointError as e:
        raise StartError(f"{path} is neither a Hugging Face directory (config.json + safetensors) nor an orbax run: {e}") from None
    if "model" not in meta:
        raise StartError(f"{root}/{step}: the checkpoint's meta has no model config")
    run_dir = os.path.dirname(root) if os.path.basename(root) == "checkpoints" else root
    card = _read_json(os.path.join(run_dir, CARD)) if os.path.isfile(os.path.join(run_dir, CARD)) else {}
    return Start(run_dir, "run", dict(meta["model"]), _run_tokenizer(run_dir, card), card,
                 os.path.basename(run_dir), step_dir=os.path.join(root, str(step)))


def resolve_start(path_or_name: str) -> Start:
    """The start named by an HF directory, an orbax run directory (or its checkpoints/ or a step
    directory) or the name `starter`. Raises StartError: "no checkpoint at PATH" when nothing is there."""
    text = os.path.expanduser(str(path_or_name or ""))
    if not text:
        raise StartError("no checkpoint named (give an HF directory, a run directory or 'starter')")
    path = os.path.abspath(text)
    if not os.path.isdir(path) and text == STARTER_NAME:
        path = os.path.join(repo_root(), STARTER_NAME)
    if not os.path.isdir(path):
        raise StartError(f"no checkpoint at {text}")
    if _is_hf_dir(path):
        return _hf_start(path)
    return _run_start(path)


# ---------------------------------------------------------------------------------------------- fitting

def _default_config() -> Any:
    from mpa_jax.config import DEFAULT_CONFIG, load_config_file

    return load_config_file(DEFAULT_CONFIG)


def _set(section: Any, key: str, value: Any) -> None:
    """Set a config field, keeping its type where an int/float field gets the other (JSON drops it)."""
    current = section[key]
    if isinstance(current, bool) or isinstance(value, bool):
        section[key] = value
    elif isinstance(current, int) and isinstance(value, float) and value == int(value):
        section[key] = int(value)
    elif isinstance(current, float) and isinstance(value, int):
        section[key] = float(value)
    elif isinstance(current, tuple) and isinstance(value, list):
        section[key] = tuple(value)
    else:
        section[key] = value


def _note(message: str) -> None:
    print(f"mpa: note: {message}", file=sys.stderr, flush=True)


def config_for_start(config: Any | None, start: Start, *, workdir: str | None = None, explicit: Iterable[str] = (),
                     log: Callable[[str], None] | None = None) -> Any:
    """A copy of `config` (None: the default config) fitted to `start`.

    Set from the checkpoint: every `config.model` architecture field (the run settings - dtypes, remat,
    scan_layers, kernels - stay the config's), `model.init_from` (`start.hf_dir(workdir)`),
    `tokenizer.path` and `tokenizer.vocab_size` (its own tokenizer), `context.format` / `.reasoning`
    (from its card, when it has one). `explicit`: the `section.key` names the user set on the command
    line; those win for the context format and the tokenizer path (said in one line), and conflict
    (StartError naming the fix) for the model's shape and for `rollout.max_total_tokens` above the
    checkpoint's positions, which is otherwise lowered to them with one line through `log`
    (default: stderr).
    """
    from mpa_jax import models
    from mpa_jax.models.config import RUN_FIELDS
    from mpa_jax.tokenizer import TokenizerError, check_tokenizer_fits, load_tokenizer

    log = log or _note
    explicit = set(explicit)
    c = (_default_config() if config is None else config).copy_and_resolve_references()
    try:
        cfg = models.ModelConfig.from_hf(start.hf_config)
    except ValueError as e:
        raise StartError(f"{start.path}: its config.json is not a model this project runs ({e})") from None

    # the model: the checkpoint's shape, the config's run settings
    for field in dataclasses.fields(cfg):
        key = field.name
        if key in RUN_FIELDS or key == "extra" or key not in c.model:
            continue
        value = getattr(cfg, key)
        if isinstance(value, (dict, list)) or (value is None and c.model[key] is not None):
            continue
        if f"model.{key}" in explicit and c.model[key] != value:
            raise StartError(f"--config.model.{key}={c.model[key]} conflicts with the checkpoint's {key}={value}:"
                             " drop the override (a start's model shape is its own)")
        _set(c.model, key, value)
    c.model.init_from = start.hf_dir(workdir)

    # the tokenizer: its own
    if "tokenizer.path" in explicit and str(c.tokenizer.path):
        if os.path.abspath(os.path.expanduser(str(c.tokenizer.path))) != (start.tokenizer_dir or ""):
            log(f"tokenizer.path={c.tokenizer.path} given: used instead of the checkpoint's own tokenizer")
    elif start.tokenizer_dir is None:
        raise StartError(f"the checkpoint at {start.path} carries no tokenizer (tokenizer.json): pass"
                         " --config.tokenizer.path=DIR with the tokenizer it was trained with")
    else:
        c.tokenizer.path = start.tokenizer_dir
    from mpa_jax.tokenizer.select import PROJECT_BPE

    if str(c.tokenizer.path) != PROJECT_BPE:
        try:
            tok = load_tokenizer(os.path.expanduser(str(c.tokenizer.path)))
            check_tokenizer_fits(tok, start.vocab_size, f"the checkpoint at {start.path}")
        except TokenizerError as e:
            raise StartError(str(e)) from None
        _set(c.tokenizer, "vocab_size", tok.vocab_size)

    # the context format it was trained with
    ctx = start.context
    if ctx and "context" in c:
        for key in ("format", "reasoning"):
            if key not in ctx or key not in c.context:
                continue
            if f"context.{key}" in explicit:
                if str(c.context[key]) != str(ctx[key]):
                    log(f"context.{key}={c.context[key]} given; the checkpoint was trained with {ctx[key]}")
            else:
                c.context[key] = str(ctx[key])

    # positions
    positions = start.max_positions
    if "rollout" in c and int(c.rollout.max_total_tokens) > positions:
        if "rollout.max_total_tokens" in explicit:
            raise StartError(f"--config.rollout.max_total_tokens={c.rollout.max_total_tokens} exceeds the checkpoint's"
                             f" {positions} positions (max_position_embeddings): pass a value <= {positions}")
        log(f"rollout.max_total_tokens {c.rollout.max_total_tokens} -> {positions}, the checkpoint's max_position_embeddings")
        c.rollout.max_total_tokens = positions
    return c


def fit_start(config: Any | None, path_or_name: str, *, workdir: str | None = None, explicit: Iterable[str] = (),
              log: Callable[[str], None] | None = None) -> tuple[Any, Start]:
    """(`config` fitted to the start `path_or_name`, the Start): `resolve_start` then `config_for_start`,
    the one way a library caller (an RL run or an experiment given `init=`) names a start, as the CLI's
    `--checkpoint` does. Raises StartError."""
    start = resolve_start(path_or_name)
    return config_for_start(config, start, workdir=workdir, explicit=explicit, log=log), start


__all__ = ["CARD", "STARTER_NAME", "Start", "StartError", "card_for_export", "config_for_start", "fit_start", "make_card",
           "read_card", "resolve_start", "stamp_run_dir", "write_hf_card"]
