"""A world-general refresh (`mpa_jax.sft.world_refresh`) of the shipped starter on real parts: gated instances
in persona worlds of no split, oracle demonstrations, orbax SFT checkpoints and an HF export; a finished
refresh is reused, an interrupted one resumes, and one of other settings in the same directory is refused."""
from __future__ import annotations

import json
import os

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs import Task, read_jsonl
from mpa_jax.envs.benchmark import FRESH_PERSONA_BASE, PERSONAS, templates_for
from mpa_jax.sft.world_refresh import REFRESH_WORLD_OFFSET, world_refresh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_refresh_trains_on_worlds_of_no_split_and_is_reused(tmp_path):
    config = load_config_file(os.path.join(ROOT, "configs", "rl_lift.py"))
    config.sft.batch_size, config.sft.seq_len = 2, 1024
    temps = list(templates_for("train"))[:3]
    out = str(tmp_path / "refresh")
    kw = dict(worlds=4, per_template=2, steps=2, lr=1e-4, templates=temps)
    export, info = world_refresh(config, os.path.join(ROOT, "starter"), out, **kw)
    tasks = read_jsonl(os.path.join(out, "tasks.jsonl"), Task)
    base = FRESH_PERSONA_BASE + REFRESH_WORLD_OFFSET
    assert len(tasks) == info["tasks"] == 6 and {t.id.split("/")[1] for t in tasks} == {t.name for t in temps}
    worlds = {t.persona_seed for t in tasks}
    assert worlds <= set(range(base, base + 4)) and not worlds & {w for ws in PERSONAS.values() for w in ws}
    assert os.path.exists(os.path.join(export, "config.json")) and os.path.exists(os.path.join(export, "tokenizer.json"))
    assert info["steps"] == 2 and info["train_loss"] == info["train_loss"]  # trained: a finite loss
    mtime = os.path.getmtime(os.path.join(export, "config.json"))
    assert world_refresh(config, os.path.join(ROOT, "starter"), out, **kw) == (export, info)  # reused, not retrained
    assert os.path.getmtime(os.path.join(export, "config.json")) == mtime
    assert json.load(open(os.path.join(out, "refresh.json")))["export_dir"] == export
    os.remove(os.path.join(out, "refresh.json"))  # interrupted after SFT's last checkpoint: resumes there, trains nothing
    again = world_refresh(config, os.path.join(ROOT, "starter"), out, **kw)
    assert again[0] == export and abs(again[1]["train_loss"] - info["train_loss"]) < 1e-6
    with pytest.raises(ValueError, match="other settings"):
        world_refresh(config, os.path.join(ROOT, "starter"), out, **{**kw, "steps": 3})
    config.context.reasoning = "full"  # demonstrations with <think> sentences are other settings too
    with pytest.raises(ValueError, match="other settings"):
        world_refresh(config, os.path.join(ROOT, "starter"), out, **kw)
