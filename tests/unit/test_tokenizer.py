"""The tokenizer: building the project BPE, HF-format save/load (checked by transformers), the CLI command."""
import json
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import ml_collections
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mpa_jax import cli
from mpa_jax.tokenizer import (
    SPECIAL_TOKENS,
    TokenizerError,
    build_tokenizer,
    load_tokenizer,
    render_chat,
    synthetic_corpus,
    tokenizer_for_config,
)

ROOT = Path(__file__).resolve().parents[2]
# An outside fixture the repository does not carry (the official Qwen3 chat template in ../shared beside the
# clone): a clone without it skips the test that needs it, saying so; CI (which has it, and sets CI) runs it.
FIXTURE = ROOT.parent / "shared" / "fixtures" / "chat_templates" / "qwen3.jinja"
needs_qwen3_fixture = pytest.mark.skipif(not FIXTURE.is_file() and not os.environ.get("CI"),
                                         reason=f"outside fixture missing: {FIXTURE} (the official Qwen3 chat template; CI has it)")
CORPUS = synthetic_corpus(n=120)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tok = build_tokenizer(CORPUS, 1000, str(d))
    return tok, d


@pytest.fixture(scope="module")
def hf_tok(built):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(built[1]))


def test_import_stays_light():
    code = "import sys, mpa_jax.tokenizer; print([m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_build_has_qwen_special_tokens_and_the_requested_size(built):
    tok, d = built
    assert sorted(os.listdir(d)) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert len(tok) == tok.vocab_size <= 1000
    ids = [tok.token_id(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS) and min(ids) == tok.vocab_size - len(SPECIAL_TOKENS)
    assert tok.eos_token_ids == [tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")]
    assert tok.pad_id == tok.token_id("<|endoftext|>")
    # Special tokens written in text are single tokens; markup stays in decoded text, control tokens can be skipped.
    ids = tok.encode("<|im_start|>assistant\n<think>x</think><tool_call>{}</tool_call><|im_end|>")
    assert ids[0] == tok.token_id("<|im_start|>") and ids[-1] == tok.token_id("<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think><tool_call>{}</tool_call>"
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.token_id("<nope>")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_build_is_deterministic(built, tmp_path):
    build_tokenizer(CORPUS, 1000, str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (built[1] / name).read_bytes(), name


def test_build_rejects_a_tiny_vocabulary():
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(CORPUS, 100)


texts = st.lists(
    st.sampled_from(list(SPECIAL_TOKENS) + ["{\"name\": ", "\n\n", "  ", "kg", "é", "e\u0301", "日本", "🙂", "'s"])
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    max_size=12,
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=texts)
def test_transformers_loads_it_and_agrees(built, hf_tok, s):
    tok, _ = built
    ids = tok.encode(s)
    assert ids == hf_tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", s)


def test_transformers_sees_the_special_tokens(built, hf_tok):
    tok, _ = built
    assert hf_tok.eos_token == "<|im_end|>" and hf_tok.pad_token == "<|endoftext|>"
    assert len(hf_tok) == len(tok)
    for t in SPECIAL_TOKENS:
        assert hf_tok.convert_tokens_to_ids(t) == tok.token_id(t)


def _foreign_dir(src: Path, dst: Path, template: str) -> None:
    """An HF directory in the older layout: the chat template inline in tokenizer_config.json."""
    dst.mkdir()
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    config["eos_token"] = "<|endoftext|>"
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))


@needs_qwen3_fixture
def test_load_any_hf_directory_offline(built, tmp_path):
    from transformers import AutoTokenizer

    _tok, d = built
    _foreign_dir(d, tmp_path / "hf", FIXTURE.read_text())
    tok = load_tokenizer(str(tmp_path / "hf"))
    assert tok.chat_template == FIXTURE.read_text()
    assert tok.eos_token_ids == [tok.token_id("<|endoftext|>"), tok.token_id("<|im_end|>"), 7]
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": "r"}]
    assert render_chat(tok, msgs) == hf.apply_chat_template(msgs, tokenize=False)
    # Saving writes the newer layout (template in chat_template.jinja) and loads back the same.
    tok.save(str(tmp_path / "resaved"))
    again = load_tokenizer(str(tmp_path / "resaved"))
    assert again.chat_template == tok.chat_template and again.encode("<|im_end|> x") == tok.encode("<|im_end|> x")
    # Named templates (a list) in chat_template.json.
    (tmp_path / "resaved" / "chat_template.jinja").unlink()
    (tmp_path / "resaved" / "chat_template.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": "T"}]}))
    assert load_tokenizer(str(tmp_path / "resaved")).chat_template == "T"
    # Older configs store special tokens as AddedToken dicts.
    config = json.loads((tmp_path / "resaved" / "tokenizer_config.json").read_text())
    config["eos_token"] = {"__type": "AddedToken", "content": "<|im_start|>", "special": True}
    (tmp_path / "resaved" / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(str(tmp_path / "resaved")).eos_token_ids[0] == tok.token_id("<|im_start|>")


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))


def _config(path: str = "", vocab: int = 700) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.tokenizer = ml_collections.ConfigDict({"path": path, "vocab_size": vocab, "corpus_tasks": 0})
    c.oracle = ml_collections.ConfigDict({"split": "train"})
    return c


def test_tokenizer_for_config_builds_once_then_reuses(tmp_path, built):
    tok = tokenizer_for_config(_config(), str(tmp_path))
    tj = tmp_path / "tokenizer" / "tokenizer.json"
    stamp = tj.stat().st_mtime_ns
    assert len(tok) <= 700 and tok.chat_template
    again = tokenizer_for_config(_config(), str(tmp_path))
    assert tj.stat().st_mtime_ns == stamp and again.encode("send a message") == tok.encode("send a message")
    bigger = tokenizer_for_config(_config(vocab=800), str(tmp_path))  # size changed: rebuilt
    assert len(bigger) > len(tok)
    loaded = tokenizer_for_config(_config(path=str(built[1])), str(tmp_path / "other"))
    assert len(loaded) == len(built[0]) and not (tmp_path / "other").exists()


def test_cli_command_builds_a_loadable_tokenizer(tmp_path, capsys):
    out = tmp_path / "tk"
    rc = cli.main(["tokenizer", "--config", str(ROOT / "configs" / "tiny.py"), "--workdir", str(tmp_path / "run"),
                   "--out", str(out), "--config.tokenizer.vocab_size=600", "--max-tasks", "0"])
    assert rc == 0
    tok = load_tokenizer(str(out))
    assert len(tok) <= 600 and tok.chat_template and json.loads((out / "mpa_build.json").read_text())["vocab_size"] == 600
    rc = cli.main(["tokenizer", "--config", str(ROOT / "configs" / "tiny.py"), "--workdir", str(tmp_path / "run"),
                   "--out", str(out), "--config.tokenizer.vocab_size=10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "vocab_size" in err[-1]


def test_corpus_uses_envs_episodes_then_the_synthetic_corpus():
    from mpa_jax.tokenizer.corpus import project_corpus, synthetic_corpus

    synthetic = synthetic_corpus(seed=0)
    texts = project_corpus("train", 3, seed=0)
    envs_texts = texts[: len(texts) - len(synthetic)]
    assert texts[len(envs_texts):] == synthetic
    assert len(envs_texts) >= 3 and any("<|im_start|>assistant\n" in t for t in envs_texts)
    assert project_corpus("train", 0, seed=0) == synthetic  # no tasks: the synthetic corpus alone
