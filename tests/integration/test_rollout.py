"""Episodes end to end with the embedded engine: exact token-in/token-out against the learner, `mpa rollout`."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import jax

from mpa_jax import models  # noqa: E402
from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.config import load_config_file  # noqa: E402
from mpa_jax.envs import Trajectory, load_tasks, read_jsonl  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.eval import Evaluator, eval_metrics  # noqa: E402
from mpa_jax.rollout.testing import tiny_checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    tok = tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
    ckpt = tiny_checkpoint(str(root / "policy"), vocab_size=tok.vocab_size, seed=2)
    tok.save(ckpt)
    config = load_config_file(os.path.join(REPO, "configs", "tiny.py"))
    config.rollout.max_new_tokens = 12
    config.rollout.max_turns = 3
    config.rollout.batch_size = 4
    dev = load_tasks("dev")
    tasks = [next(t for t in dev if t.category == c) for c in ("tool_use", "memory", "skills", "subagent")]
    return {"tok": tok, "ckpt": ckpt, "config": config, "tasks": tasks, "root": root}


def test_sampled_rollouts_logprobs_match_learner_on_the_whole_trajectory(setup):
    """Exact token-in/token-out: re-scoring each whole episode with the learner's forward pass gives the
    behaviour log-probs on every sampled token (mask 1), across turns and tool feedback."""
    from mpa_jax.kernels.logprobs import chunked_logprobs

    config, tok = setup["config"], setup["tok"]
    config.rollout.temperature = 1.0
    engine = Engine.from_pretrained(setup["ckpt"], max_batch=4)
    out = str(setup["root"] / "sampled.jsonl")
    Evaluator(config, setup["tasks"], tokenizer=tok, progress=False).run(engine, out, greedy=False, seed=3)
    trajs = read_jsonl(out, Trajectory)
    m = eval_metrics(trajs)
    assert len(trajs) == 4 and m["episodes"] == 4
    assert m["overall"]["tasks"] + m["infra_failures"] == 4
    assert set(m["by_category"]) <= {"Tool Use", "Memory", "Skills", "Sub-agent", "Follow-up"}
    assert sum(b["tasks"] for b in m["by_category"].values()) == m["overall"]["tasks"]
    cfg, params = engine.cfg, engine.params
    width = max(len(t.tokens) for t in trajs)
    ids = np.zeros((len(trajs), width), np.int32)
    for i, t in enumerate(trajs):
        ids[i, : len(t.tokens)] = t.tokens

    @jax.jit
    def learner(params, ids):
        hidden = models.hidden_states(cfg, params, ids[:, :-1])
        return chunked_logprobs(hidden, models.unembedding(cfg, params), ids[:, 1:], chunk_size=512, temperature=1.0)[0]

    logp = np.asarray(learner(params, ids))
    n_sampled = 0
    for i, t in enumerate(trajs):
        mask = np.asarray(t.loss_mask[1:], bool)
        n_sampled += int(mask.sum())
        np.testing.assert_allclose(np.asarray(t.logprobs[1:])[mask], logp[i, : len(t.tokens) - 1][mask], atol=1e-4)
        assert t.costs["output_tokens"] == sum(t.loss_mask)
        assert t.provenance["weight_version"] == "policy" and t.provenance["env"] == "sandbox"
        assert t.verification is not None
    assert n_sampled >= 4 * 12 * 0.5  # the random policy produced real samples


def test_mpa_rollout_command_writes_trajectories_and_summary(setup, capsys):
    from mpa_jax.cli import main

    out = str(setup["root"] / "cli" / "dev.jsonl")
    rc = main(["rollout", "--config", os.path.join(REPO, "configs", "tiny.py"), "--workdir", str(setup["root"] / "run"),
               "--checkpoint", setup["ckpt"], "--split", "dev", "--max-tasks", "3", "--out", out,
               "--config.rollout.max_new_tokens=8", "--config.rollout.max_turns=2"])
    assert rc == 0
    trajs = read_jsonl(out, Trajectory)
    assert len(trajs) == 3 and [t.task_id for t in trajs] == [t.id for t in load_tasks("dev")[:3]]
    with open(out[: -len(".jsonl")] + ".summary.json") as f:
        summary = json.load(f)
    assert summary["episodes"] == 3 and summary["greedy"] is True and summary["label"] == os.path.basename(setup["ckpt"])
    assert sum(b["tasks"] for b in summary["by_domain"].values()) == summary["overall"]["tasks"]
    printed = capsys.readouterr().out
    assert "Overall" in printed and "harness off: 3 dev tasks" in printed and out in printed


def test_mpa_rollout_rejects_bad_input(setup, capsys, tmp_path):
    from mpa_jax.cli import main

    base = ["rollout", "--config", os.path.join(REPO, "configs", "tiny.py"), "--workdir", str(tmp_path)]
    assert main(base + ["--split", "nonsense"]) == 2
    assert "--split" in capsys.readouterr().err
    empty = tmp_path / "not_a_checkpoint"
    empty.mkdir()
    assert main(base + ["--checkpoint", str(empty)]) == 2  # neither weights nor an orbax run
    assert "neither a Hugging Face directory (config.json + safetensors) nor an orbax run" in capsys.readouterr().err
    (empty / "config.json").write_text('{"model_type": "gpt2"}')
    (empty / "model.safetensors").write_bytes(b"")
    assert main(base + ["--checkpoint", str(empty)]) == 2
    assert "its config.json is not a model this project runs" in capsys.readouterr().err
    assert main(base + ["--config.rollout.replicas=4096"]) == 2
    assert "config.rollout.replicas=4096" in capsys.readouterr().err


def test_engine_replicas_from_config():
    import jax

    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.engines import engine_replicas

    config = load_config_file(os.path.join(REPO, "configs", "tiny.py"))
    cores = len(os.sched_getaffinity(0))
    assert engine_replicas(config) == min(cores, jax.local_device_count())  # auto: one per usable core
    config.rollout.replicas = 2
    assert engine_replicas(config) == 2
