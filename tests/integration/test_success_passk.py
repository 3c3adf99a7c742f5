"""Sampled pass@k next to greedy success (mpa_jax/eval/success.py, eval/metrics.py): the unbiased estimator's maths, its
split by seen / held-out templates and category, and a micro run of the SFT success hook with samples."""
import itertools
import math
import os
import random

import pytest

from mpa_jax.envs import Trajectory, Verification, load_tasks, read_jsonl
from mpa_jax.eval.metrics import pass_at_k
from mpa_jax.eval import held_out_templates, pass_at_k_metrics


def _brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The definition: the fraction of the k-subsets of the n runs that hold at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_unbiased_estimator_equals_the_subset_definition(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(outcomes, k))
    # pass@1 is the mean success; pass@n is "any success"
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 2, 4) == pytest.approx(1 - math.comb(6, 4) / math.comb(8, 4))


def _traj(task, ok: bool, infra: bool = False) -> Trajectory:
    # the provenance the runner writes: metrics group runs by the task's category and template from it
    return Trajectory(task_id=task.id, tokens=[], loss_mask=[], logprobs=[], steps=[],
                      verification=Verification(success=ok, score=float(ok)), infra_failure=infra,
                      provenance={"category": task.category, "template": task.template, "domain": task.domain})


def test_pass_at_k_metrics_split_by_templates_and_category():
    ho = held_out_templates()
    dev = load_tasks("dev")
    seen = [t for t in dev if t.template not in ho][:3]
    held = [t for t in dev if t.template in ho][:2]
    tasks = seen + held
    rng = random.Random(0)
    outcomes = {t.id: [rng.random() < p for _ in range(6)] for t, p in zip(tasks, [0.0, 0.3, 0.9, 0.5, 1.0])}
    by_id = {t.id: t for t in tasks}
    trajs = [_traj(by_id[tid], ok) for tid, runs in outcomes.items() for ok in runs]
    trajs.append(_traj(tasks[0], True, infra=True))  # an infra failure is neither a run nor a success
    m = pass_at_k_metrics(trajs, tasks, [1, 3, 6])
    assert m["samples"] == 6

    def expect(ts, k):
        return sum(pass_at_k(6, sum(outcomes[t.id]), k) for t in ts) / len(ts)

    for k in (1, 3, 6):
        assert m[f"pass@{k}"] == pytest.approx(expect(tasks, k))
        assert m[f"pass@{k}_seen"] == pytest.approx(expect(seen, k))
        assert m[f"pass@{k}_held_out"] == pytest.approx(expect(held, k))
        for cat in {t.category for t in tasks}:
            assert m[f"pass@{k}_{cat}"] == pytest.approx(expect([t for t in tasks if t.category == cat], k))
    assert m["pass@1"] == pytest.approx(sum(sum(r) / 6 for r in outcomes.values()) / 5)
    assert m["pass@1"] <= m["pass@3"] <= m["pass@6"]
    with pytest.raises(ValueError, match="fewer than k=8"):
        pass_at_k_metrics(trajs, tasks, [8])
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k_metrics(trajs, tasks, [0])


def test_sft_success_hook_reports_sampled_pass_at_k_next_to_greedy(tmp_path):
    """A micro model after 3 SFT steps, the hook with 4 samples per task: greedy keys and pass@1/2/4 keys
    are logged; pass@1 is the sampled runs' mean success (recounted from the rollout file) and pass@k
    grows with k. The rollouts really run (embedded JAX engine, sandbox env)."""
    from mpa_jax.data import encode_episode
    from mpa_jax.envs import make_env, run_oracle_episode, write_jsonl
    from mpa_jax.envs.benchmark import generate_split
    from mpa_jax.eval import success_eval
    from mpa_jax.sft import run_sft
    from mpa_jax.sft.micro import micro_config
    from mpa_jax.tokenizer.build import build_tokenizer
    from mpa_jax.tokenizer.template import QWEN3_CHAT_TEMPLATE, render_chat

    c = micro_config(vocab=384, hidden=32, layers=1, steps=3, lr=3e-3)
    c.rollout.update(dict(max_turns=2, max_new_tokens=12))
    train = generate_split("train", per_template=8, templates=["contact_group.create"])
    dev = generate_split("dev", per_template=3, templates=["contact_group.create"])
    env = make_env("sandbox", config=c)
    eps = [run_oracle_episode(env, t, seed=i, reasoning=str(c.context.reasoning)) for i, t in enumerate(train)]
    tok = build_tokenizer([render_chat(None, e.messages, None, chat_template=QWEN3_CHAT_TEMPLATE) for e in eps],
                          384, str(tmp_path / "tok"))
    data = str(tmp_path / "data.jsonl")
    write_jsonl(data, [encode_episode(tok, t, e.messages, e.tools, e.steps, e.verification, "oracle", i, 384)
                       for i, (t, e) in enumerate(zip(train, eps))])
    c.tokenizer.path = str(tmp_path / "tok")
    hook = success_eval(c, dev, tok, str(tmp_path / "success"), samples=4, ks=(1, 2, 4), temperature=1.0)
    seen = {}
    run_sft(c, str(tmp_path / "run"), data, on_eval=lambda s, p: seen.setdefault(s, hook(s, p)), progress=False)
    m = seen[3]
    assert {"success", "success_seen", "pass@1", "pass@2", "pass@4", "pass@1_seen", "pass@4_tool_use"} <= set(m)
    runs = read_jsonl(os.path.join(str(tmp_path / "success"), "step_3.sampled.jsonl"), Trajectory)
    assert len(runs) == 4 * len(dev)
    assert sorted(r.task_id for r in runs) == sorted(t.id for t in dev for _ in range(4))
    assert m["pass@1"] == pytest.approx(sum(bool(r.verification and r.verification.success) for r in runs) / len(runs))
    assert 0.0 <= m["pass@1"] <= m["pass@2"] <= m["pass@4"] <= 1.0
    # different sampling seeds per repeated episode: the 4 runs of a task are not all the same text
    by_task = {}
    for r in runs:
        by_task.setdefault(r.task_id, set()).add(tuple(r.tokens))
    assert any(len(v) > 1 for v in by_task.values())


def test_success_eval_rejects_k_above_samples(tmp_path):
    from mpa_jax.eval import success_eval
    from mpa_jax.sft.micro import micro_config

    c = micro_config(vocab=384, hidden=32, layers=1, steps=1, lr=1e-3)
    with pytest.raises(ValueError, match="k=8 needs at least 8 samples"):
        success_eval(c, [], None, str(tmp_path), samples=4, ks=(1, 8))
