"""Naming a start (`mpa_jax.start`): resolution of an HF directory, the shipped starter and a missing path;
fitting a config to a checkpoint (shape, tokenizer, context format, positions: adapted with one line, or
one error naming the fix); configs by name from any directory. Real files throughout: a tiny Qwen3
checkpoint written by `transformers`, a real BPE tokenizer, the repository's starter/."""
from __future__ import annotations

import json
import os

import pytest

from mpa_jax import cli
from mpa_jax.config import ConfigError, load_config_file
from mpa_jax.rollout.testing import tiny_checkpoint
from mpa_jax.start import CARD, StartError, config_for_start, resolve_start
from mpa_jax.tokenizer import build_tokenizer, synthetic_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny Qwen3 HF directory (1,024 positions, rope_theta 1e4) with its own 520-id tokenizer and a card."""
    d = str(tmp_path_factory.mktemp("hf"))
    tok = build_tokenizer(synthetic_corpus(n=60), 520, d)
    tiny_checkpoint(d, vocab_size=tok.vocab_size, max_position_embeddings=1024)
    with open(os.path.join(d, CARD), "w", encoding="utf-8") as f:
        json.dump({"mpa_checkpoint": 1, "kind": "hf", "context": {"format": "compact", "reasoning": "none"}}, f)
    return d


def test_resolve_an_hf_directory_the_starter_and_a_missing_path(hf, tmp_path):
    s = resolve_start(hf)
    assert (s.kind, s.tokenizer_dir, s.max_positions) == ("hf", hf, 1024)
    assert s.context == {"format": "compact", "reasoning": "none"} and s.hf_dir() == hf
    starter = resolve_start("starter")  # the name, from any directory: the shipped starter planner
    assert starter.path == os.path.join(ROOT, "starter") and starter.kind == "hf"
    assert starter.context == json.load(open(os.path.join(ROOT, "starter", "datasheet.json")))["context"]  # datasheet read as a card
    with pytest.raises(StartError, match=f"^no checkpoint at {tmp_path / 'nope'}$"):
        resolve_start(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StartError, match="neither a Hugging Face directory .* nor an orbax run"):
        resolve_start(str(tmp_path / "empty"))


def test_config_is_fitted_to_the_checkpoint_and_says_what_it_adapted(hf):
    notes = []
    tiny = load_config_file("tiny")
    c = config_for_start(tiny, resolve_start(hf), log=notes.append)
    assert (c.model.hidden_size, c.model.rope_theta, c.model.num_hidden_layers) == (64, 10000.0, 2)  # the checkpoint's shape
    assert c.model.param_dtype == tiny.model.param_dtype  # run settings stay the config's
    assert c.model.init_from == hf and c.tokenizer.path == hf and c.tokenizer.vocab_size == 520
    assert (c.context.format, c.context.reasoning) == ("compact", "none")
    assert c.rollout.max_total_tokens == 1024
    assert notes == ["rollout.max_total_tokens 4096 -> 1024, the checkpoint's max_position_embeddings"]
    assert tiny.model.hidden_size == 128 and tiny.rollout.max_total_tokens == 4096  # the caller's config is untouched


def test_explicit_conflicts_name_the_fix(hf):
    start = resolve_start(hf)
    c = load_config_file("tiny")
    c.rollout.max_total_tokens = 4096
    with pytest.raises(StartError, match=r"--config.rollout.max_total_tokens=4096 exceeds the checkpoint's 1024 positions.*<= 1024"):
        config_for_start(c, start, explicit={"rollout.max_total_tokens"})
    with pytest.raises(StartError, match=r"--config.model.hidden_size=128 conflicts with the checkpoint's hidden_size=64"):
        config_for_start(load_config_file("tiny"), start, explicit={"model.hidden_size"})
    notes = []
    c = load_config_file("tiny")  # an explicit context format wins, and the difference is said
    fitted = config_for_start(c, start, explicit={"context.format"}, log=notes.append)
    assert fitted.context.format == "json" and any("trained with compact" in n for n in notes)


def test_cli_error_for_a_start_that_does_not_fit_is_one_line(hf, tmp_path, capsys):
    rc = cli.main(["rollout", "--checkpoint", hf, "--workdir", str(tmp_path / "w"), "--config.rollout.max_total_tokens=2048"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "pass a value <= 1024" in err


def test_configs_by_name_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert load_config_file("tiny").name == load_config_file("configs/tiny.py").name == load_config_file("tiny.py").name
    assert load_config_file("starter").context.format == "compact"
    with pytest.raises(ConfigError, match="config not found: nope .*tiny"):
        load_config_file("nope")
    out = tmp_path / "dev.jsonl"
    assert cli.main(["tasks", "--split", "dev", "--out", str(out), "--workdir", str(tmp_path / "run")]) == 0  # the default config
    assert out.is_file() and json.load(open(tmp_path / "run" / "config.json"))["name"] == load_config_file("tiny").name
    assert cli.main(["tasks", "--config", "nope", "--workdir", str(tmp_path / "r")]) == 2
    assert "config not found: nope" in capsys.readouterr().err


def test_a_new_bpe_for_a_checkpoint_only_when_named(hf, tmp_path):
    """With a checkpoint, the run's tokenizer is the checkpoint's; the project BPE is built only when
    `tokenizer.path` names it (`project-bpe`), and it must still fit the embedding."""
    from mpa_jax.tokenizer import load_tokenizer, tokenizer_for_config
    from mpa_jax.tokenizer.select import PROJECT_BPE

    c = config_for_start(load_config_file("tiny"), resolve_start(hf), log=lambda _: None)
    tok = tokenizer_for_config(c, str(tmp_path / "run"))
    assert tok.encode("text Alex at 7pm") == load_tokenizer(hf).encode("text Alex at 7pm")
    assert not (tmp_path / "run" / "tokenizer").exists()
    c.tokenizer.path, c.tokenizer.vocab_size, c.tokenizer.corpus_tasks = PROJECT_BPE, 400, 0
    bpe = tokenizer_for_config(c, str(tmp_path / "run"))
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file() and bpe.vocab_size <= 400
    assert bpe.encode("text Alex at 7pm") != tok.encode("text Alex at 7pm")
