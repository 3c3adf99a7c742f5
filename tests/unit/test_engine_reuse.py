"""The engine's prefix cache, every family (Qwen3, Qwen3.5 hybrid with its DeltaNet state, Qwen3.5-MoE):
an episode's next turn, a group's G samples and a common system prompt reuse what the slot rows hold,
and give the tokens (greedy: identical; sampled with the same seeds: identical) and log-probs (within
float tolerance) of the same requests with the cache off (an engine with `prefix_cache=False`, or
`generate_batch`: every prompt prefilled whole);
`cached_tokens` says what was reused, and nothing cached outlives a weight update."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from mpa_jax import models
from mpa_jax.rollout.engine import Engine
from mpa_jax.rollout.types import SamplingParams

QWEN3 = models.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
QWEN35 = models.ModelConfig(family="qwen3_5", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.25,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            full_attention_interval=2, tie_word_embeddings=True, max_position_embeddings=512)
MOE = QWEN35.replace(family="qwen3_5_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                     shared_expert_intermediate_size=24, expert_layout="fused")
FAMILIES = {"qwen3": QWEN3, "qwen3_5": QWEN35, "qwen3_5_moe": MOE}


def _engine(cfg, **kw):
    params = jax.tree.map(lambda x: 3.0 * x, models.init_params(cfg, jax.random.key(1)))  # peaked logits
    kw = {"slots": 4, "slot_len": 160, "chunk": 4, "prefill_chunk": 8, "max_batch": 4, **kw}
    return Engine(cfg, params, **kw)


def _same(got, want, atol=1e-5):
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=atol)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_turns_groups_and_common_prefix_reuse_equal_no_reuse(name):
    cfg = FAMILIES[name]
    engine, reference = _engine(cfg), _engine(cfg, prefix_cache=False)
    rng = np.random.default_rng(0)
    system = rng.integers(1, cfg.vocab_size, 19).tolist()  # every episode's system prompt
    greedy = SamplingParams(max_new_tokens=9, temperature=0.0)
    # Turn 0 of three episodes sharing the system prompt, then two more turns each (the feedback appended
    # after everything the turn before held): the reference prefills every prompt whole.
    prompts = [system + rng.integers(1, cfg.vocab_size, n).tolist() for n in (4, 11, 6)]
    for turn in range(3):
        want = reference.generate(prompts, greedy, [0, 1, 2])
        before = engine.stats()
        got = engine.generate(prompts, greedy, [0, 1, 2])
        _same(got, want)
        after = engine.stats()
        if turn:  # each episode continues its own row: only the new tokens (and the last one) are computed
            assert [r.cached_tokens for r in got] == [len(p) - 5 for p in prompts]
        assert after["cached_tokens"] - before["cached_tokens"] == sum(r.cached_tokens for r in got)
        assert after["prefill_tokens"] - before["prefill_tokens"] == sum(len(p) - r.cached_tokens for p, r in zip(prompts, got))
        prompts = [p + r.token_ids + rng.integers(1, cfg.vocab_size, 4).tolist() for p, r in zip(prompts, got)]
    # A group of G = 4 samples of one new prompt (sampled, own seeds): the prompt is prefilled once.
    prompt = system + rng.integers(1, cfg.vocab_size, 13).tolist()
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0)
    want = reference.generate([prompt] * 4, sampled, [5, 6, 7, 8])
    before = engine.stats()
    got = engine.generate([prompt] * 4, sampled, [5, 6, 7, 8])
    _same(got, want)
    computed = engine.stats()["prefill_tokens"] - before["prefill_tokens"]
    assert sorted(r.cached_tokens for r in got)[1:] == [len(prompt)] * 3  # the other three copy the first's row
    if cfg.family == "qwen3":  # attention only: the system prompt itself comes from another row too
        assert computed == len(prompt) - sorted(r.cached_tokens for r in got)[0] and computed < len(prompt) - len(system) + 1
    else:  # a recurrent state exists only at a row's end: the first sample computes the whole prompt
        assert computed == len(prompt)
    assert reference.stats()["cached_tokens"] == 0
    engine.close()
    reference.close()


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_reuse_over_two_replicas_and_weight_updates_invalidate(name):
    assert jax.local_device_count() >= 2, "needs 2 host devices (tests/conftest.py sets 8)"
    cfg = FAMILIES[name]
    engine, reference = _engine(cfg, replicas=2), _engine(cfg, replicas=2, prefix_cache=False)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in (7, 15, 10, 5)]
    sp = SamplingParams(max_new_tokens=8, temperature=0.7)
    first = engine.generate(prompts, sp, [1, 2, 3, 4])
    nxt = [p + r.token_ids + [3, 4] for p, r in zip(prompts, first)]
    want = reference.generate(nxt, sp, [9, 10, 11, 12])
    got = engine.generate(nxt, sp, [9, 10, 11, 12])  # each episode continues its own row, on its replica
    _same(got, want)
    assert all(r.cached_tokens > 0 for r in got)
    # New weights: nothing cached may be reused; results name the new version.
    new = jax.tree.map(lambda x: x * 0.9, engine.params)
    engine.update_weights(new, "v2")
    later = [p + r.token_ids + [5] for p, r in zip(nxt, got)]
    after = engine.generate(later, sp, [1, 2, 3, 4])
    assert all(r.cached_tokens == 0 and r.weight_versions == ("v2",) for r in after)
    fresh = Engine(cfg, new, slots=4, slot_len=160, chunk=4, prefill_chunk=8, max_batch=4, replicas=2)
    _same(after, fresh.generate(later, sp, [1, 2, 3, 4]))
    for e in (engine, reference, fresh):
        e.close()


def test_reuse_off_computes_every_prompt_token():
    engine = _engine(QWEN3, prefix_cache=False)
    prompt = list(range(1, 30))
    out = engine.generate([prompt] * 3, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [r.cached_tokens for r in out] == [0, 0, 0] and engine.stats()["prefill_tokens"] == 3 * len(prompt)
    engine.close()


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_a_decode_chunk_computes_the_live_rows_only_and_leaves_the_others(name):
    """Issue 49: a chunk gathers the live rows of a replica into the smallest width that holds them
    (1, a quarter of the rows, all): two live rows out of eight give the tokens and log-probs they get when
    every row runs, and the idle rows' caches and states come back bit for bit."""
    from mpa_jax.rollout.engine.decoder import SlotDecoder

    cfg = FAMILIES[name]
    params = jax.tree.map(lambda x: 3.0 * x, models.init_params(cfg, jax.random.key(1)))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in (5, 9, 3, 12, 7, 4, 10, 6)]
    outs, states = [], []
    for live_rows in ([3, 6], list(range(8))):
        dec = SlotDecoder(cfg, slots=8, max_len=64, chunk=4, chunk_tokens=16, max_prefill=4)
        dec.set_weights(params, "v0")
        for lo in (0, 4):
            dec.admit([(s, s, 0, False, prompts[s], 0) for s in range(lo, lo + 4)])
        before = jax.device_get(dec.state)
        pos = np.array([len(p) for p in prompts], np.int32)
        live = np.zeros(8, bool)
        live[live_rows] = True
        out = dec.decode(pos, np.zeros(8, np.int32), live, np.arange(8, dtype=np.uint32), np.full(8, 1.0, np.float32),
                         np.full(8, -1, np.int32), np.ones(8, np.float32), np.full(8, 8, np.int32), np.full((8, 4), -1, np.int32),
                         greedy=False, filtered=False, n_top=0, steps=4, span=32)
        outs.append(out)
        states.append((before, jax.device_get(dec.state)))
        # rows computed: a quarter of the eight for two live rows, all eight when all run
        assert {key[5] for key in dec.programs if key[0] == "chunk"} == {2 if len(live_rows) == 2 else 8}
    (toks, lps, emitted, *_), (all_toks, all_lps, *_) = outs
    assert emitted[[3, 6], :4].all() and not emitted[[0, 1, 2, 4, 5, 7]].any()
    np.testing.assert_array_equal(toks[[3, 6]], all_toks[[3, 6]])
    np.testing.assert_allclose(lps[[3, 6]], all_lps[[3, 6]], atol=1e-5)
    before, after = states[0]
    idle = [0, 1, 2, 4, 5, 7]
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(np.asarray(b)[:, idle], np.asarray(a)[:, idle])
