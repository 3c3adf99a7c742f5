"""Export: orbax training checkpoint -> HF directory that transformers loads with the same logits."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mpa_jax.config import load_config_file
from mpa_jax.sft import run_sft
from mpa_jax.sft.synthetic import tiny_test_config, write_trajectories
from mpa_jax.train import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]  # the `mpa` entry point


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    data = write_trajectories(str(d / "d.jsonl"), 32, 256, seed=31)
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), steps=3)
    c.model.tie_word_embeddings = False  # exercise a separate lm_head too
    c.sft.eval_fraction, c.sft.eval_every = 0.25, 2  # and the held-out loss hook
    seen = []
    r = run_sft(c, str(d / "run"), data, progress=False, on_eval=lambda step, params: seen.append(step) or {"hook": float(step)})
    assert seen == [2, 3]
    return r


def test_held_out_loss_and_eval_hook_are_logged(run):
    from mpa_jax.train import read_metrics

    evals = [r for r in read_metrics(run.metrics_path) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [2, 3] and [r["eval/hook"] for r in evals] == [2.0, 3.0]
    assert run.eval_loss == evals[-1]["eval/loss"] and np.isfinite(run.eval_loss)
    train = [r for r in read_metrics(run.metrics_path) if "train/loss" in r]
    assert {"train/tokens_per_s", "train/lr", "train/grad_norm", "train/mfu"} <= set(train[-1])
    assert os.listdir(os.path.join(os.path.dirname(run.metrics_path), "tb"))  # TensorBoard events


def _safetensors_header(path):
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def test_export_streams_each_tensor_and_transformers_matches(run, tmp_path, monkeypatch):
    import torch
    import transformers

    from mpa_jax import export, models

    reads = []
    real = export.read_param
    monkeypatch.setattr(export, "read_param", lambda d, p: reads.append(p) or real(d, p))
    out = export.export_checkpoint(run.checkpoint_dir, str(tmp_path / "hf32"), dtype="float32", max_shard_bytes=40_000)
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert len(shards) > 1
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) == set(shards)
    # every parameter read exactly once, one at a time; the optimizer state never
    assert len(reads) == len(set(reads)) == len(index["weight_map"])
    assert all(p[0] != "opt_state" for p in reads)

    ids = np.random.default_rng(0).integers(0, 256, size=(2, 12)).astype(np.int32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    ours = models.from_pretrained(out)
    np.testing.assert_allclose(np.asarray(ours(ids)), want, rtol=2e-4, atol=2e-4)
    # the exported weights are those of the latest step, bit for bit in float32
    from mpa_jax.train import find_step_dir

    root, step = find_step_dir(run.checkpoint_dir)
    assert step == 3
    leaf = reads[0]
    saved = real(os.path.join(root, "3", "state"), leaf)
    flat = ours.params
    for k in leaf:
        flat = flat[k]
    np.testing.assert_array_equal(np.asarray(flat), saved)


def test_bfloat16_export_through_the_cli(run, tmp_path):
    out = str(tmp_path / "hf16")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = subprocess.run(MPA + ["export", "--checkpoint", os.path.dirname(run.checkpoint_dir),
                          "--out", out, "--workdir", str(tmp_path / "w")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["model_type"] == "qwen3" and cfg["hidden_size"] == 32
    assert os.path.isfile(os.path.join(out, "generation_config.json"))
    shards = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    header = _safetensors_header(os.path.join(out, shards[0]))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    res = subprocess.run(MPA + ["export", "--checkpoint", str(tmp_path / "nothing"),
                          "--out", out, "--workdir", str(tmp_path / "w")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 2 and "no checkpoint at" in res.stderr


def test_export_of_a_directory_without_checkpoints_is_a_clear_error(tmp_path):
    from mpa_jax.export import export_checkpoint

    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        export_checkpoint(str(tmp_path / "empty"), str(tmp_path / "out"))


def test_a_run_can_start_from_an_exported_model(run, tmp_path):
    from mpa_jax.export import export_checkpoint

    hf = export_checkpoint(run.checkpoint_dir, str(tmp_path / "hf"), dtype="float32")
    data = os.path.join(os.path.dirname(os.path.dirname(run.metrics_path)), "d.jsonl")
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), steps=1)
    c.model.init_from = hf
    warm = run_sft(c, str(tmp_path / "warm"), data, progress=False)
    assert warm.losses[0] < run.losses[0] - 0.05  # starts from the trained weights, not from scratch
