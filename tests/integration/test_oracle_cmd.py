"""`mpa oracle`: sandbox oracle episodes encoded into Trajectories with assistant-only loss masks."""
import os
import subprocess
import sys

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs.contract import Trajectory, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPA = [sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())"]


def _config():
    c = load_config_file(os.path.join(ROOT, "configs/tiny.py"))
    c.tokenizer.vocab_size = 1024
    c.tokenizer.corpus_tasks = 20
    c.oracle.variants = 2
    return c


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from mpa_jax.data import oracle_dataset

    workdir = str(tmp_path_factory.mktemp("oracle"))
    path, _, _ = oracle_dataset(_config(), workdir, split="train", max_tasks=5, progress=False)
    return workdir, path


def test_trajectories_hold_the_episode_and_an_assistant_only_mask(made):
    from mpa_jax.tokenizer import load_tokenizer

    workdir, path = made
    trajs = read_jsonl(path, Trajectory)
    assert len(trajs) == 10  # 5 tasks x 2 variants
    tok = load_tokenizer(os.path.join(workdir, "tokenizer"))
    for t in trajs:
        assert t.provenance["planner"] == "oracle" and t.provenance["env"] == "sandbox"
        assert t.verification is not None and t.verification.success
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs) and set(t.logprobs) == {0.0}
        assert t.steps and any(s.action.kind == "tool_call" for s in t.steps)
        assert t.messages[0]["role"] == "system" and any(m["role"] == "assistant" for m in t.messages)
        learned = tok.decode([i for i, m in zip(t.tokens, t.loss_mask) if m])
        prompt = tok.decode([i for i, m in zip(t.tokens, t.loss_mask) if not m])
        assert "<tool_call>" in learned and "<|im_end|>" in learned
        assert "<|im_start|>" not in learned  # role headers are never trained on
        first_call = next(s.action for s in t.steps if s.action.kind == "tool_call")
        assert first_call.name in learned
        user = next(m["content"] for m in t.messages if m["role"] == "user")
        assert user[:20] in prompt and user[:20] not in learned
        assert t.costs["output_tokens"] == sum(t.loss_mask)
    # the two variants of a task are seeded differently but solve the same task
    assert trajs[0].task_id == trajs[1].task_id and trajs[0].provenance["seed"] != trajs[1].provenance["seed"]


def test_cli_writes_the_file_and_prints_a_summary(made, tmp_path):
    workdir, _ = made
    out = str(tmp_path / "o.jsonl")
    res = subprocess.run(MPA + ["oracle", "--split", "dev", "--out", out, "--max-tasks", "3", "--workdir", workdir,
                                "--config.tokenizer.vocab_size=1024", "--config.oracle.variants=1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(read_jsonl(out, Trajectory)) == 3
    assert "success" in res.stdout and "100.0%" in res.stdout
    bad = subprocess.run(MPA + ["oracle", "--split", "nosuch", "--workdir", workdir, "--config.tokenizer.vocab_size=1024"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "nosuch" in bad.stderr
