"""Pretrained init is right by construction: a run with `model.init_from` uses that checkpoint's own
tokenizer (never a freshly built project BPE), refuses a tokenizer that does not fit the embedding, and
the whole path oracle data -> SFT (scanned layers) -> export -> reload works on a real (tiny) Hugging
Face checkpoint written by `transformers`."""
import json
import os

import numpy as np
import pytest

from mpa_jax.config import load_config_file
from mpa_jax.sft.synthetic import tiny_test_config
from mpa_jax.tokenizer import TokenizerError, build_tokenizer, load_tokenizer, synthetic_corpus, tokenizer_for_config

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA_ROWS = 12  # released checkpoints pad the embedding past the tokenizer (Qwen3: 151,936 rows, 151,669 ids)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Qwen3 checkpoint saved by transformers, with its own tokenizer beside the weights."""
    import torch
    import transformers

    d = tmp_path_factory.mktemp("pretrained")
    tok = build_tokenizer(synthetic_corpus(n=80), 520, str(d))
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(
        vocab_size=tok.vocab_size + EXTRA_ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=tok.token_id("<|im_end|>"), pad_token_id=tok.pad_id,
    )
    transformers.Qwen3ForCausalLM(hf_cfg).save_pretrained(str(d))
    return str(d)


def _config(hf: str, tmp: str):
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), steps=2, seq_len=4096, batch_size=8)
    c.model.init_from = hf
    c.model.vocab_size = 4096  # what a from-scratch model would use: must be ignored with init_from
    c.tokenizer.vocab_size = 700  # likewise the project BPE size
    c.oracle.max_tasks = 24
    c.sft.export_dtype = "float32"
    c.model.scan_layers = True  # a run setting applied on top of the checkpoint's config: stacked in training, HF layout on disk
    return c


def test_init_from_uses_the_checkpoints_tokenizer_never_a_project_bpe(hf_dir, tmp_path):
    tok = tokenizer_for_config(_config(hf_dir, str(tmp_path)), str(tmp_path / "run"))
    own = load_tokenizer(hf_dir)
    assert tok.vocab_size == own.vocab_size and tok.encode("text Alex at 7pm") == own.encode("text Alex at 7pm")
    assert not (tmp_path / "run" / "tokenizer").exists()  # nothing was built


def test_a_checkpoint_without_tokenizer_and_a_misfit_tokenizer_are_refused(hf_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(hf_dir, name), bare / name)
    with pytest.raises(TokenizerError, match="has no tokenizer.json: set config.tokenizer.path"):
        tokenizer_for_config(_config(str(bare), str(tmp_path)), str(tmp_path / "run"))
    # A bigger vocabulary than the embedding: refused with one sentence naming both sizes.
    big = tmp_path / "big"
    build_tokenizer(synthetic_corpus(n=80), 700, str(big))
    c = _config(str(bare), str(tmp_path))
    c.tokenizer.path = str(big)
    rows = json.load(open(bare / "config.json"))["vocab_size"]
    with pytest.raises(TokenizerError, match=f"has 700 ids but config.model.init_from=.* has {rows} embedding rows"):
        tokenizer_for_config(c, str(tmp_path / "run"))
    # A tokenizer without the chat-format tokens: refused, naming them.
    import tokenizers

    plain = tmp_path / "plain"
    plain.mkdir()
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tk.save(str(plain / "tokenizer.json"))
    c.tokenizer.path = str(plain)
    with pytest.raises(TokenizerError, match="lacks the chat-format tokens"):
        tokenizer_for_config(c, str(tmp_path / "run"))


def test_oracle_sft_export_reload_on_a_pretrained_checkpoint(hf_dir, tmp_path):
    import torch
    import transformers

    from mpa_jax import models
    from mpa_jax.data import oracle_dataset
    from mpa_jax.envs.contract import Trajectory, read_jsonl
    from mpa_jax.sft import run_sft

    c = _config(hf_dir, str(tmp_path))
    work = str(tmp_path / "run")
    data, _, _ = oracle_dataset(c, work, progress=False)
    own = load_tokenizer(hf_dir)
    trajs = read_jsonl(data, Trajectory)
    assert trajs and max(max(t.tokens) for t in trajs) < own.vocab_size
    # The oracle's ids are the checkpoint tokenizer's: the first prompt decodes to the chat format.
    assert own.decode(trajs[0].tokens[:3]).startswith("<|im_start|>")

    res = run_sft(c, work, data, export=True, progress=False)
    assert res.steps == 2 and np.isfinite(res.train_loss)
    out = res.export_dir
    # The export ships the checkpoint's tokenizer, byte for byte the one it started from.
    assert open(os.path.join(out, "tokenizer.json"), "rb").read() == open(os.path.join(hf_dir, "tokenizer.json"), "rb").read()
    assert json.load(open(os.path.join(out, "config.json")))["vocab_size"] == own.vocab_size + EXTRA_ROWS

    # Reload: our loader and transformers agree on the fine-tuned weights, which moved from the start.
    model = models.from_pretrained(out, dtype="float32")
    ids = np.asarray([trajs[0].tokens[:24]], np.int32)
    ours = np.asarray(model(ids))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=2e-4)
    start = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        before = start(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(before - ref).max() > 1e-3
    assert load_tokenizer(out).encode("text Alex") == own.encode("text Alex")


def test_sft_on_diverged_weights_skips_every_update_and_stops_with_one_error(hf_dir, tmp_path):
    """A checkpoint with a NaN weight (a diverged run): every step's loss is non-finite, so no update is
    applied, no checkpoint is written, and `sft.max_bad_updates` steps in a row stop the run with one error."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from mpa_jax.sft import SFTDiverged, run_sft
    from mpa_jax.sft.synthetic import write_trajectories

    bad = tmp_path / "diverged"
    shutil.copytree(hf_dir, bad)
    (st,) = [f for f in os.listdir(bad) if f.endswith(".safetensors")]
    tensors = load_file(str(bad / st))
    name = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    tensors[name] = tensors[name].copy()
    tensors[name][:, 0] = np.nan
    save_file(tensors, str(bad / st), metadata={"format": "pt"})
    c = _config(str(bad), str(tmp_path))
    c.sft.steps, c.sft.log_every, c.sft.max_bad_updates, c.checkpoint.every = 8, 1, 3, 1
    own = load_tokenizer(str(bad))
    data = write_trajectories(str(tmp_path / "d.jsonl"), 16, own.vocab_size, seed=3)
    with pytest.raises(SFTDiverged, match=r"3 SFT steps in a row .*max_bad_updates=3.*stopped at step 3.*last good checkpoint: none written yet"):
        run_sft(c, str(tmp_path / "run"), data, progress=False)
    recs = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["train/nonfinite_steps"] for r in recs if "train/nonfinite_steps" in r] == [1.0, 1.0, 1.0]
    assert not [d for d in os.listdir(tmp_path / "run" / "checkpoints") if d.isdigit()]
