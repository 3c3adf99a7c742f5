"""The agent loop over an untrained model sampled hot: whatever the model emits, every episode ends
with a reason, nothing raises, and malformed turns are counted (issue 19, item 2)."""
from __future__ import annotations

import pytest

import jax  # noqa: F401

from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.envs import load_tasks, make_env  # noqa: E402
from mpa_jax.eval import eval_metrics  # noqa: E402
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.rollout.testing import tiny_checkpoint  # noqa: E402

FINISH = {"answer", "max_turns", "max_tokens", "infra"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)
    # A padded embedding, like the tiny config's (4,096 rows for a smaller tokenizer).
    ckpt = tiny_checkpoint(str(tmp_path_factory.mktemp("hot") / "m"), vocab_size=tok.vocab_size + 256, seed=11, scale=0.3)
    # The 10 shortest first prompts among 40 dev tasks (one prompt bucket: fewer compilations).
    env = make_env("sandbox")
    sized = []
    for t in load_tasks("dev")[:40]:
        obs = env.reset(t)
        sized.append((len(tk.ChatSession(tok, obs["messages"], obs.get("tools") or None).ids), t))
    sized.sort(key=lambda x: x[0])
    return tok, ckpt, [t for _, t in sized[:10]], sized[9][0]


def _check(trajs, tasks, cfg):
    assert len(trajs) == len(tasks)
    for t in trajs:
        assert t.finish_reason in FINISH, t.finish_reason
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
        assert len(t.tokens) <= cfg.max_total_tokens or (t.infra_failure and not any(t.loss_mask))
        assert t.verification is not None
        if t.infra_failure:
            assert t.provenance["infra_reason"]
    return eval_metrics(trajs)


def test_hot_sampling_from_an_untrained_model_finishes_every_episode(setup):
    tok, ckpt, tasks, longest = setup
    engine = Engine.from_pretrained(ckpt, max_batch=16, vocab_limit=tok.vocab_size)
    # The token budget lets some episodes run out of room (the max_tokens path) while others end otherwise.
    cfg = EpisodeConfig.defaults(max_turns=3, max_new_tokens=16, max_total_tokens=longest + 60, temperature=2.0, batch_size=10, seed=3, max_output_errors=0)
    trajs = run_episodes(engine, tok, tasks, lambda: make_env("sandbox"), cfg)
    summary = _check(trajs, tasks, cfg)
    # With the vocabulary rule no id is undecodable, so no episode is lost to infra.
    assert summary["infra_failures"] == 0 and "undecodable_token" not in summary["output_errors"]
    print(summary["finish_reasons"], summary["output_errors"])
    assert sum(summary["output_errors"].values()) > 0  # garbage is reported, not hidden
    assert all(max(t.tokens) < tok.vocab_size for t in trajs)


def test_without_the_vocabulary_rule_undecodable_ids_end_episodes_as_infra(setup):
    """An engine that samples the padding rows (no vocab_limit): those episodes end as infra with the
    reason, the others go on; nothing raises."""
    tok, ckpt, tasks, longest = setup
    engine = Engine.from_pretrained(ckpt, max_batch=16)
    cfg = EpisodeConfig.defaults(max_turns=2, max_new_tokens=16, max_total_tokens=longest + 60, temperature=2.0, batch_size=10, seed=3, max_output_errors=0)
    trajs = run_episodes(engine, tok, tasks, lambda: make_env("sandbox"), cfg)
    summary = _check(trajs, tasks, cfg)
    assert summary["output_errors"].get("undecodable_token", 0) == summary["infra_failures"] > 0
    assert all("outside the tokenizer" in t.provenance["infra_reason"] for t in trajs if t.infra_failure)


def test_sampled_tokens_are_keyed_by_the_task_not_its_place_in_the_list(setup):
    """Issue 55 item 5: an episode's seed is keyed by (base, task id, sample), so the same task sampled hot under
    one base gives the same tokens in any order or subset of a list; the second occurrence of a task in one list is
    its sample 1 (a different seed, so different tokens)."""
    tok, ckpt, tasks, longest = setup
    engine = Engine.from_pretrained(ckpt, max_batch=16, vocab_limit=tok.vocab_size)
    cfg = EpisodeConfig.defaults(max_turns=2, max_new_tokens=16, max_total_tokens=longest + 60, temperature=2.0, batch_size=10,
                                 seed=5, max_output_errors=0, schedule="rounds")

    def sampled(ts):
        return {t.id + f"#{i}": [x for x, m in zip(tr.tokens, tr.loss_mask) if m]
                for i, (t, tr) in enumerate(zip(ts, run_episodes(engine, tok, ts, lambda: make_env("sandbox"), cfg)))}

    a, b, c = tasks[:3]
    forward = sampled([a, b, c])
    by_task = {k.split("#")[0]: v for k, v in forward.items()}
    assert len({tuple(v) for v in by_task.values()}) == 3 and all(by_task.values())
    backward = {k.split("#")[0]: v for k, v in sampled([c, b, a]).items()}
    assert backward == by_task
    assert {k.split("#")[0]: v for k, v in sampled([b]).items()} == {b.id: by_task[b.id]}
    twice = list(sampled([c, c]).values())
    assert twice[0] == by_task[c.id] and twice[1] != twice[0]
