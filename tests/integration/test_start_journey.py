"""Journey 1 of issue 54, the silent tokenizer switch, as a regression test through the real `mpa` CLI.

A "pretrained" Hugging Face checkpoint (tiny Qwen3 weights written by `transformers`) carries its own
tokenizer, of the same size as the project BPE the config would build, so a switch could not be caught
by a size check. `mpa sft --checkpoint HF` (no --export) must leave a run directory that is itself a start
(tokenizer + card), `mpa rl --init RUN` (the old spelling), `mpa eval --checkpoint RUN` and `mpa experiment
--checkpoint HF` must run with that tokenizer, and the run's saved config must be the model that ran (the
checkpoint's shape). Real
orbax checkpoints, the real sandbox env, the embedded engine; nothing mocked.
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys

import pytest

from mpa_jax.sft.synthetic import write_trajectories
from mpa_jax.start import CARD, resolve_start
from mpa_jax.tokenizer import build_tokenizer, load_tokenizer, synthetic_corpus

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]
VOCAB = 520
ROPE = 12345.0  # not the tiny config's 1e6: the saved config must show the checkpoint's
SMALL = ["--config.tokenizer.vocab_size=520",  # the project BPE would be as wide as the checkpoint's tokenizer
         "--config.sft.seq_len=64", "--config.sft.batch_size=8", "--config.sft.steps=2", "--config.sft.warmup_steps=1",
         "--config.sft.log_every=1", "--config.sft.eval_fraction=0.0", "--config.sft.only_success=false",
         "--config.checkpoint.every=1", "--config.rollout.max_new_tokens=8", "--config.rollout.max_turns=1",
         "--config.rollout.replicas=1"]


def _mpa(*args, cwd=ROOT):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    return subprocess.run(MPA + list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny Qwen3 HF checkpoint with its own 520-id tokenizer beside the weights (no card: a foreign model)."""
    import torch
    import transformers

    d = tmp_path_factory.mktemp("pretrained")
    tok = build_tokenizer(synthetic_corpus(n=80), VOCAB, str(d))
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=tok.vocab_size + 12, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                                   max_position_embeddings=2048, rope_theta=ROPE, eos_token_id=tok.token_id("<|im_end|>"),
                                   pad_token_id=tok.pad_id)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    return str(d)


def test_sft_rl_eval_from_a_checkpoint_keep_its_tokenizer(pretrained, tmp_path):
    own = load_tokenizer(pretrained)
    data = write_trajectories(str(tmp_path / "d.jsonl"), 40, own.vocab_size, seed=3)
    run = str(tmp_path / "run")
    res = _mpa("sft", "--checkpoint", pretrained, "--data", data, "--max-steps", "2", "--workdir", run, *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    # the run directory (no --export) carries the checkpoint's tokenizer and a card: it is a start
    assert filecmp.cmp(os.path.join(run, "tokenizer", "tokenizer.json"), os.path.join(pretrained, "tokenizer.json"), shallow=False)
    card = json.load(open(os.path.join(run, CARD)))
    assert card["kind"] == "run" and card["tokenizer"] == "tokenizer" and card["max_positions"] == 2048
    assert card["context"] == {"format": "json", "reasoning": "full"} and card["recipe"]["command"].startswith("mpa sft --checkpoint")
    # the saved config is what ran: the checkpoint's shape, not the tiny config's 128 / 1e6
    saved = json.load(open(os.path.join(run, "config.json")))
    assert saved["model"]["hidden_size"] == 32 and saved["model"]["rope_theta"] == ROPE
    assert saved["model"]["vocab_size"] == own.vocab_size + 12 and saved["rollout"]["max_total_tokens"] == 2048
    assert "rollout.max_total_tokens 4096 -> 2048" in res.stderr  # adapted, and said in one line
    start = resolve_start(run)
    assert start.kind == "run" and start.tokenizer_dir == os.path.join(run, "tokenizer") and start.step_dir.endswith("/2")
    old = str(tmp_path / "old_run")  # a run made before cards: its saved config still names the tokenizer
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("tokenizer", CARD))
    assert resolve_start(old).tokenizer_dir == pretrained

    # RL with the exact spelling (--init RUN): the checkpoint's tokenizer, never a new BPE
    rl = str(tmp_path / "rl")
    res = _mpa("rl", "--init", run, "--max-steps", "1", "--workdir", rl, "--config.rl.tasks_per_step=2",
               "--config.rl.group_size=2", "--config.rl.minibatches=1", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not os.path.exists(os.path.join(rl, "tokenizer", "mpa_build.json")), "RL built a project BPE"
    assert filecmp.cmp(os.path.join(rl, "tokenizer", "tokenizer.json"), os.path.join(pretrained, "tokenizer.json"), shallow=False)
    rl_saved = json.load(open(os.path.join(rl, "config.json")))
    assert rl_saved["tokenizer"]["path"] == os.path.join(run, "tokenizer") and rl_saved["model"]["hidden_size"] == 32
    assert json.load(open(os.path.join(rl, CARD)))["recipe"]["start"] == run
    # continued without naming the start again: the card names it, and the run resumes on the same model
    res = _mpa("rl", "--max-steps", "2", "--workdir", rl, "--config.rl.tasks_per_step=2", "--config.rl.group_size=2",
               "--config.rl.minibatches=1", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"continuing {rl} from its start {run}" in res.stderr and "(resumed from 1)" in res.stdout
    exported = json.load(open(os.path.join(rl, "start_hf", CARD)))  # the run exported once for RL, with its card
    assert exported["kind"] == "hf" and exported["tokenizer"] == "." and exported["exported_from"].endswith("checkpoints/2")
    assert exported["recipe"]["command"] == card["recipe"]["command"] and exported["context"] == card["context"]

    # eval of the run directory: the prompt's ids are the checkpoint tokenizer's encoding
    res = _mpa("eval", "--checkpoint", run, "--max-tasks", "1", "--workdir", str(tmp_path / "ev"), *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    rollouts = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp_path / "ev") for f in fs if f.endswith(".jsonl")]
    traj = json.loads(open(rollouts[0]).readline())
    assert own.decode(traj["tokens"][:40]).startswith("<|im_start|>system")


def test_an_experiment_starts_from_a_checkpoint_as_every_command_does(pretrained, tmp_path):
    """`mpa experiment care-vs-vanilla --checkpoint HF`: the CLI fits the config to the start as for `mpa rl`, the
    experiment's saved config is the model that ran, and each arm's run directory carries its own resolved config
    (its algo) and card with the checkpoint's tokenizer (never a new BPE), so the arm is a start itself."""
    w = str(tmp_path / "exp")
    res = _mpa("experiment", "care-vs-vanilla", "--checkpoint", pretrained, "--seeds", "1", "--workdir", w,
               "--config.rl.steps=1", "--config.rl.tasks_per_step=2", "--config.rl.group_size=2", "--config.rl.minibatches=1",
               "--config.rl.templates=calc.tip_split", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.load(open(os.path.join(w, "config.json")))
    assert (saved["model"]["hidden_size"], saved["model"]["rope_theta"], saved["tokenizer"]["path"]) == (32, ROPE, pretrained)
    assert saved["rollout"]["max_total_tokens"] == 2048 and json.load(open(os.path.join(w, "summary.json")))["init"] == pretrained
    for algo in ("care", "vanilla"):
        arm = os.path.join(w, f"{algo}-s0")
        cfg = json.load(open(os.path.join(arm, "config.json")))
        assert cfg["rl"]["algo"] == algo and cfg["model"] == saved["model"] and cfg["tokenizer"] == saved["tokenizer"]
        assert filecmp.cmp(os.path.join(arm, "tokenizer", "tokenizer.json"), os.path.join(pretrained, "tokenizer.json"), shallow=False)
        assert not os.path.exists(os.path.join(arm, "tokenizer", "mpa_build.json")), "an arm built a project BPE"
        card = json.load(open(os.path.join(arm, CARD)))
        assert card["stage"] == "rl" and card["recipe"]["start"] == pretrained
        assert card["recipe"]["command"].startswith("mpa experiment care-vs-vanilla --checkpoint")
        start = resolve_start(arm)
        assert start.kind == "run" and start.step_dir.endswith("checkpoints/1") and start.hf_config["hidden_size"] == 32


def test_a_start_without_a_tokenizer_is_refused_never_a_new_bpe(pretrained, tmp_path):
    """A checkpoint that carries no tokenizer: one line naming the fix; nothing is built."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(pretrained, name), bare / name)
    res = _mpa("rollout", "--checkpoint", str(bare), "--workdir", str(tmp_path / "w"), *SMALL)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "carries no tokenizer" in res.stderr and "--config.tokenizer.path=DIR" in res.stderr
    assert not os.path.exists(tmp_path / "w" / "tokenizer")
    res = _mpa("eval", "--checkpoint", str(tmp_path / "missing"), "--workdir", str(tmp_path / "w"))
    assert res.returncode == 2 and f"no checkpoint at {tmp_path / 'missing'}" in res.stderr
    res = _mpa("sft", "--config.model.init_from=" + str(tmp_path / "missing"), "--workdir", str(tmp_path / "w"))
    assert res.returncode == 2 and "no checkpoint at" in res.stderr and "tokenizer.json" not in res.stderr
