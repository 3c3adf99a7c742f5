"""`mpa sft`: trains, reports against the unigram baseline, exports; bad input exits 2 with one line."""
import json
import os
import subprocess
import sys

from mpa_jax.sft.synthetic import write_trajectories

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]
TINY = [
    "--config.model.vocab_size=256", "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
    "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2", "--config.model.num_key_value_heads=1",
    "--config.model.head_dim=16", "--config.model.logprob_chunk=128", "--config.sft.seq_len=64", "--config.sft.batch_size=8",
    "--config.sft.steps=4", "--config.sft.warmup_steps=1", "--config.sft.log_every=1", "--config.sft.only_success=false",
    "--config.sft.eval_fraction=0.0",
]


def _mpa(*args):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run(MPA + list(args), capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_sft_command_trains_and_exports(tmp_path):
    data = write_trajectories(str(tmp_path / "d.jsonl"), 40, 256, seed=41)
    run = str(tmp_path / "run")
    res = _mpa("sft", "--data", data, "--workdir", run, "--export", *TINY)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "unigram baseline" in res.stdout and "exported Hugging Face model" in res.stdout
    assert json.load(open(os.path.join(run, "hf", "config.json")))["vocab_size"] == 256
    # both the run directory and the export describe themselves (mpa_jax/start.py): kind, recipe, context, positions
    run_card, hf_card = (json.load(open(os.path.join(d, "mpa_checkpoint.json"))) for d in (run, os.path.join(run, "hf")))
    assert (run_card["kind"], hf_card["kind"]) == ("run", "hf")
    for card in (run_card, hf_card):
        assert card["recipe"]["command"].startswith("mpa sft --data") and card["recipe"]["config"] == "tiny"
        assert card["context"] == {"format": "json", "reasoning": "full"} and card["model"]["vocab_size"] == 256
    steps = [json.loads(x)["step"] for x in open(os.path.join(run, "metrics.jsonl")) if "train/loss" in x]
    assert steps == [1, 2, 3, 4]


def test_sft_command_bad_input_exits_2(tmp_path):
    res = _mpa("sft", "--data", str(tmp_path / "missing.jsonl"), "--workdir", str(tmp_path / "r"))
    assert res.returncode == 2 and "missing.jsonl" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n' * 10)
    res = _mpa("sft", "--data", str(bad), "--workdir", str(tmp_path / "r2"), *TINY)
    assert res.returncode == 2 and "line 1" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_sft_pass_k_flags_bad_input_exits_2(tmp_path):
    """--eval-samples needs success tasks, and k may not exceed the samples: one line each, before training."""
    data = write_trajectories(str(tmp_path / "d.jsonl"), 40, 256, seed=41)
    res = _mpa("sft", "--data", data, "--workdir", str(tmp_path / "r"), "--eval-samples", "4", *TINY)
    assert res.returncode == 2 and "--eval-success" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = _mpa("sft", "--data", data, "--workdir", str(tmp_path / "r2"), "--eval-success", "2", "--eval-samples", "4",
               "--eval-pass-k", "1", "8", *TINY)
    assert res.returncode == 2 and "k=8 needs at least 8 samples" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not os.path.exists(os.path.join(str(tmp_path / "r2"), "metrics.jsonl"))
