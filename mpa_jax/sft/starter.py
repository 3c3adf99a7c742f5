"""The starter planner: build it from `configs/starter.py`, describe it in a datasheet, check a shipped copy.

    mpa starter --config configs/starter.py --workdir runs/starter --out starter

runs, each step resumable: the project tokenizer -> oracle demonstrations on the train split (only) ->
`run_sft` with task-success evaluations on a dev subset -> export (bf16 safetensors + tokenizer) ->
a final greedy evaluation on dev tasks of seen and of held-out templates -> `<out>/datasheet.json` and
`<out>/metrics.jsonl`. The datasheet records the recipe (the config sections that decide the weights),
the data, steps, tokens, wall time and the held-out metrics; `check_datasheet` compares it with the
recipe as the repository has it now (tests/integration/test_learning.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from typing import Any, Mapping

from mpa_jax.card import recipe_hash, recipe_values

DATASHEET = "datasheet.json"
DEFAULT_DIR = "starter"


def check_datasheet(sheet: Mapping[str, Any], config: Any) -> list[str]:
    """Differences between a datasheet's recipe and `config`'s: one line per key (empty = they match).

    Keys the config gained after the build (new options with their defaults) are not differences; keys
    whose value changed, or that disappeared, are.
    """
    now = recipe_values(config)
    out = []
    for key, value in sorted(sheet["recipe"].items()):
        if key not in now:
            out.append(f"{key}: in the datasheet ({value!r}) but no longer in the config")
        elif json.loads(json.dumps(now[key], default=str)) != value:
            out.append(f"{key}: datasheet {value!r}, config now {now[key]!r}")
    return out


def load_datasheet(path: str = DEFAULT_DIR) -> dict[str, Any]:
    """The datasheet of a starter directory."""
    with open(os.path.join(path, DATASHEET), encoding="utf-8") as f:
        return json.load(f)


def _records(metrics_path: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, one per (kind, step): a resumed run logs some steps twice; the last wins."""
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            kind = next((k.split("/")[0] for k in rec if "/" in k), "")
            by_key[(kind, int(rec["step"]))] = {**by_key.get((kind, int(rec["step"])), {}), **rec}
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[1], k[0]))]


def _window_seconds(rec: Mapping[str, Any]) -> float:
    """Seconds of one logged window (train/seconds; runs before that key: 0, their wall time is in the note)."""
    return float(rec.get("train/seconds", 0.0))


def train_summary(metrics_path: str) -> dict[str, float]:
    """Steps, loss tokens, training seconds (sum of the logged windows, evaluations between them included) and the last
    train/held-out loss from a run's metrics.jsonl."""
    steps, tokens, seconds, loss, eval_loss = 0, 0.0, 0.0, float("nan"), None
    for rec in _records(metrics_path):
        if "train/tokens" in rec:
            steps = max(steps, int(rec["step"]))
            tokens += rec["train/tokens"]
            seconds += _window_seconds(rec)
            loss = rec["train/loss"]
        if "eval/loss" in rec:
            eval_loss = rec["eval/loss"]
    timed = any("train/seconds" in r for r in _records(metrics_path))
    return {"steps": steps, "loss_tokens": tokens, "train_seconds": seconds if timed else None, "train_loss": loss,
            "eval_loss": eval_loss}


def success_curve(metrics_path: str) -> list[dict[str, float]]:
    """One row per success evaluation: step, loss tokens and training seconds so far, the eval/success* values."""
    out, tokens, seconds = [], 0.0, 0.0
    for rec in _records(metrics_path):
        if "train/tokens" in rec:
            tokens += rec["train/tokens"]
            seconds += _window_seconds(rec)
        if "eval/success" in rec:
            out.append({"step": rec["step"], "loss_tokens": tokens, "train_seconds": seconds,
                        **{k[5:]: v for k, v in rec.items() if k.startswith("eval/success")}})
    return out


def build_starter(config: Any, workdir: str, out_dir: str, *, eval_seen: int = 96, eval_held_out: int = 48,
                  curve_seen: int = 32, curve_held_out: int = 16, data: str | None = None,
                  log: Any = print, note: str = "") -> dict[str, Any]:
    """Build (or finish building) the starter into `out_dir`; returns the datasheet. Every stage resumes:
    existing demonstrations are reused, SFT resumes from its latest checkpoint."""
    from mpa_jax.data import oracle_dataset
    from mpa_jax.envs.context import ContextFormat
    from mpa_jax.eval import CATEGORY_NAMES, Evaluator, eval_metrics, select_tasks, success_eval, success_view
    from mpa_jax.sft.trainer import run_sft
    from mpa_jax.tokenizer import tokenizer_for_config

    t0 = time.perf_counter()
    os.makedirs(workdir, exist_ok=True)
    tok = tokenizer_for_config(config, workdir)
    data = data or os.path.join(workdir, f"oracle-{config.oracle.split}.jsonl")
    if not os.path.isfile(data):
        data, _, _ = oracle_dataset(config, workdir, out=data)
    seed = int(config.tasks.seed)
    on_eval = None
    if curve_seen or curve_held_out:
        on_eval = success_eval(config, select_tasks("dev", n_seen=curve_seen, n_held_out=curve_held_out, seed=seed), tok,
                               os.path.join(workdir, "success"), log=log)
    result = run_sft(config, workdir, data, export=True, on_eval=on_eval)
    ev = Evaluator(config, select_tasks("dev", n_seen=eval_seen, n_held_out=eval_held_out, seed=seed), tokenizer=tok)
    metrics = eval_metrics(ev.run(ev.engine_for(result.export_dir, workdir), os.path.join(workdir, "rollouts", "final-dev.jsonl"),
                                  greedy=True, label="starter"))
    raw = {v: k for k, v in CATEGORY_NAMES.items()}
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(result.export_dir, out_dir)
    shutil.copy(result.metrics_path, os.path.join(out_dir, "metrics.jsonl"))
    with open(data, "rb") as f:
        n_episodes = sum(1 for _ in f)
    recipe = recipe_values(config)
    sheet = {
        "name": "starter planner",
        "command": "mpa starter --config configs/starter.py --workdir runs/starter --out starter",
        "recipe": recipe,
        "recipe_hash": recipe_hash(recipe),
        "context": ContextFormat.from_config(config).to_dict(),
        "data": {"split": str(config.oracle.split), "episodes": n_episodes, "per_template": int(config.tasks.per_template),
                 "fingerprint": _sha256(data)},
        "train": train_summary(result.metrics_path),
        "rows_per_step": int(config.sft.batch_size), "seq_len": int(config.sft.seq_len),
        "success_curve": success_curve(result.metrics_path),
        "final_eval": {"split": "dev", "greedy": True, "tasks_seen_templates": eval_seen,
                       "tasks_held_out_templates": eval_held_out, **success_view(metrics),
                       "by_category": {raw.get(k, k): v["success"] for k, v in metrics["by_category"].items()}},
        "build_wall_s_this_invocation": time.perf_counter() - t0,
    }
    if note:
        sheet["note"] = note
    with open(os.path.join(out_dir, DATASHEET), "w", encoding="utf-8") as f:
        json.dump(sheet, f, indent=2, sort_keys=True)
    return sheet


@dataclasses.dataclass
class Starter:
    """A starter planner directory: an exported HF model + tokenizer + datasheet."""

    path: str
    hf_config: dict[str, Any]
    datasheet: dict[str, Any]


class StarterError(ValueError):
    """A starter directory is missing or incomplete; the message names the file."""


def find_starter(path: str) -> str | None:
    """`path` as given, else relative to the repository (a run may start from anywhere); None if absent."""
    if not path:
        return None
    for cand in (path, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), path)):
        if os.path.isfile(os.path.join(cand, "config.json")):
            return cand
    return None


def load_starter(path: str) -> Starter:
    """Read a starter directory's config.json and datasheet.json (one clear error when either is missing)."""
    files = {}
    for name in ("config.json", DATASHEET):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise StarterError(f"starter directory {path} has no {name}; rebuild it with `mpa starter` or pass --starter ''")
        with open(full, encoding="utf-8") as f:
            files[name] = json.load(f)
    return Starter(path, files["config.json"], files[DATASHEET])


def with_starter(config: Any, starter: Starter) -> Any:
    """A copy of `config` pointed at the starter: its model shape, its tokenizer, its context format
    (`mpa_jax.start.config_for_start`, the fitting every `--checkpoint` gets); training starts from its
    weights and packs and computes like its recipe."""
    from mpa_jax.start import config_for_start, resolve_start

    config = config_for_start(config, resolve_start(starter.path), log=lambda _line: None)
    recipe = starter.datasheet.get("recipe", {})
    for key in ("sft.seq_len", "model.compute_dtype"):  # the refresh packs and computes like the starter's recipe
        if key in recipe:
            section, name = key.split(".")
            config[section][name] = recipe[key]
    return config


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
