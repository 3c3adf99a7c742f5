"""The embedded JAX engine: parity with transformers, learner log-probs, seeds, stops, buckets, weight updates."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mpa_jax.rollout.engine.decoder import max_programs, spans_for

import jax
import torch
import transformers

from mpa_jax import models  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.rollout.testing import tiny_checkpoint  # noqa: E402
from mpa_jax.rollout.types import EngineError, SamplingParams  # noqa: E402

VOCAB = 512


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(str(tmp_path_factory.mktemp("hf") / "m"), vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def hf_model(ckpt):
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine.from_pretrained(ckpt, max_batch=4)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, n).tolist() for n in lengths]


def test_greedy_matches_transformers_generate(engine, hf_model):
    prompts = _prompts((5, 23, 11))  # different lengths: left padding inside one batch
    results = engine.generate(prompts, SamplingParams(max_new_tokens=32, temperature=0.0))
    for p, r in zip(prompts, results):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert r.token_ids == ref[0, len(p):].tolist()
        assert r.finish_reason == "length" and r.prompt_tokens == len(p)
    assert len({tuple(r.token_ids) for r in results}) == 3  # the random model is not degenerate


def test_behaviour_logprobs_equal_learner_recompute(engine):
    from mpa_jax.kernels.logprobs import chunked_logprobs

    prompts = _prompts((7, 19), seed=1)
    temperature = 0.7
    results = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=temperature), seeds=[3, 4])
    cfg, params = engine.cfg, engine.params
    # The learner's path: hidden states of the whole sequence, chunked log-probs at the same temperature.
    seqs = [p + r.token_ids for p, r in zip(prompts, results)]
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s  # right padding: earlier tokens are unaffected under causal attention

    @jax.jit
    def learner(params, ids):
        hidden = models.hidden_states(cfg, params, ids[:, :-1])
        return chunked_logprobs(hidden, models.unembedding(cfg, params), ids[:, 1:], chunk_size=128, temperature=temperature)[0]

    logp = np.asarray(learner(params, ids))
    for i, (p, r) in enumerate(zip(prompts, results)):
        np.testing.assert_allclose(np.asarray(r.logprobs), logp[i, len(p) - 1 : len(seqs[i]) - 1], atol=1e-4, rtol=0)
    # Greedy log-probs are of the raw logits.
    g = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    seq = np.asarray([prompts[0] + g.token_ids], np.int32)
    logits = np.asarray(jax.jit(lambda p, x: models.forward(cfg, p, x))(params, seq), np.float64)[0, len(prompts[0]) - 1 : -1]
    ref = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    np.testing.assert_allclose(g.logprobs, ref[np.arange(4), g.token_ids], atol=1e-4)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    prompts = _prompts((6, 14, 9), seed=2)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = engine.generate(prompts, sp, seeds=[10, 11, 12])
    b = engine.generate(prompts, sp, seeds=[10, 11, 12])
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    # A row alone (different batch composition and padding) samples the same tokens.
    (solo,) = engine.generate([prompts[1]], sp, seeds=[11])
    assert solo.token_ids == a[1].token_ids
    np.testing.assert_allclose(solo.logprobs, a[1].logprobs, atol=1e-5)
    c = engine.generate(prompts, sp, seeds=[20, 21, 22])
    assert [r.token_ids for r in c] != [r.token_ids for r in a]


def test_top_k_one_is_greedy_and_filters_keep_full_vocab_logprobs(engine):
    prompts = _prompts((8, 13), seed=3)
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    k1 = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1), seeds=[5, 6])
    assert [r.token_ids for r in k1] == [r.token_ids for r in greedy]
    # The reported log-prob is the unfiltered one (< 0), not 0 of the renormalised top-1 distribution.
    assert all(lp < -1e-6 for r in k1 for lp in r.logprobs)


def test_stop_token_ends_row_and_is_kept(engine):
    prompts = _prompts((10, 12), seed=4)
    full = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0.0))
    stop = full[0].token_ids[5]
    first = full[0].token_ids.index(stop)
    res = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0.0, stop_token_ids=(stop,)))
    assert res[0].token_ids == full[0].token_ids[: first + 1]
    assert res[0].finish_reason == "stop" and res[0].matched_stop == stop
    other = full[1].token_ids
    cut = other.index(stop) + 1 if stop in other else len(other)
    assert res[1].token_ids == other[:cut]


def test_any_mix_of_prompt_lengths_compiles_a_bounded_set_of_programs(ckpt):
    """Prompts are prefilled in fixed-size chunks and decode chunks attend over one of two spans, so the
    programs of one sampling path do not grow with the mix of lengths, settings or batch sizes."""
    engine = Engine.from_pretrained(ckpt, max_batch=4)
    sp = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine.generate(_prompts((20, 3)), sp)
    engine.generate(_prompts((25, 30, 9, 1, 2, 4, 8)), sp)
    engine.generate(_prompts((18,)), sp.replace(max_new_tokens=5))
    before, programs = engine.compiles, engine.programs
    assert programs <= 6, engine.stats()  # distinct programs of this sampling path (compiled once, shared by engines)
    engine.generate(_prompts((17, 4, 60, 11)), sp.replace(stop_token_ids=(1, 2, 3)))
    engine.generate(_prompts((5, 40, 33)), sp.replace(max_new_tokens=3))
    engine.generate_batch(_prompts((7, 50)), sp)
    assert engine.compiles == before and engine.programs == programs
    # A random mix of lengths and sampling paths (greedy, sampled, filtered) adds none past the
    # bound computed from the shape alone.
    rng = np.random.default_rng(3)
    for n in rng.integers(1, 60, 5):
        engine.generate(_prompts((int(n), int(rng.integers(1, 60)))), sp.replace(temperature=1.0, top_k=5))
    engine.generate(_prompts((9, 31)), sp.replace(temperature=0.7))
    assert engine.programs <= max_programs(engine._loop.dec.cols) <= 6, engine.stats()
    engine.close()


def test_program_bound_from_the_config_alone():
    """The bound (decode_params + an admission and a decode chunk program per span) for the default configs'
    slots: configs/tiny.py (4,096-token slots, prefill_chunk 256) and a Qwen3-1.7B shape (4,096, 512)."""
    assert spans_for(4096 + 256) == (1024, 4352) and max_programs(4096 + 256) == 5
    assert max_programs(4096 + 512) == 5 and max_programs(2048 + 256) == 5 and max_programs(200) == 3


def test_bad_inputs_are_named(engine):
    sp = SamplingParams(max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], sp)
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, VOCAB]], sp)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_update_weights_from_params_and_from_directory(ckpt, tmp_path):
    engine = Engine.from_pretrained(ckpt, max_batch=4, weight_version="v0")
    prompts = _prompts((9, 13), seed=5)
    sp = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = engine.generate(prompts, sp)
    assert {r.weight_version for r in before} == {"v0"}
    other = tiny_checkpoint(str(tmp_path / "other"), vocab_size=VOCAB, seed=7)
    fresh = Engine.from_pretrained(other, max_batch=4).generate(prompts, sp)
    assert [r.token_ids for r in fresh] != [r.token_ids for r in before]

    engine.update_weights(other, "v1")  # an exported checkpoint directory
    after = engine.generate(prompts, sp)
    assert [r.token_ids for r in after] == [r.token_ids for r in fresh]
    assert engine.weight_version == "v1" and {r.weight_version for r in after} == {"v1"}

    original = models.from_pretrained(ckpt).params  # a params pytree
    engine.update_weights(original, "v2")
    assert [r.token_ids for r in engine.generate(prompts, sp)] == [r.token_ids for r in before]
    assert engine.weight_version == "v2"

    wrong = tiny_checkpoint(str(tmp_path / "wrong"), vocab_size=VOCAB, seed=1, hidden_size=32)
    with pytest.raises(EngineError, match="different model config"):
        engine.update_weights(wrong, "bad")
    assert engine.weight_version == "v2"


def test_sharded_engine_matches_single_device(ckpt, engine):
    from mpa_jax import sharding

    assert jax.device_count() >= 4, "needs XLA_FLAGS=--xla_force_host_platform_device_count>=4 (tests/conftest.py sets 8)"
    mesh = sharding.make_mesh((2, 1, 2, 1), jax.devices()[:4])
    sharded = Engine.from_pretrained(ckpt, mesh=mesh, max_batch=4)
    prompts = _prompts((6, 15, 10), seed=6)
    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    assert [r.token_ids for r in sharded.generate(prompts, sp)] == [r.token_ids for r in engine.generate(prompts, sp)]
    leaf = sharded.params["model"]["layers"]["0"]["mlp"]["up_proj"]["kernel"]
    assert len(leaf.sharding.device_set) == 4


def test_replicas_split_the_batch_and_decode_as_one_device(ckpt, engine):
    """Weight replicas on 2 host devices (the CPU path to a second core): same tokens, log-probs and
    weight updates as the one-device engine; each replica holds the whole model."""
    assert jax.local_device_count() >= 2, "needs XLA host devices (tests/conftest.py sets 8)"
    rep = Engine.from_pretrained(ckpt, max_batch=4, replicas=2)
    leaf = rep.params["model"]["embed_tokens"]["weight"]
    assert len(leaf.sharding.device_set) == 2 and leaf.sharding.is_fully_replicated
    prompts = _prompts((6, 15, 10), seed=7)  # 3 rows: one replica also decodes a filler row
    for sp in (SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=12, temperature=1.0)):
        got, want = rep.generate(prompts, sp, seeds=[1, 2, 3]), engine.generate(prompts, sp, seeds=[1, 2, 3])
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
        np.testing.assert_allclose([r.logprobs for r in got], [r.logprobs for r in want], atol=1e-5)
    # A weight update reaches every replica.
    new = jax.tree.map(lambda x: x * 1.5, engine.params)
    single = Engine(engine.cfg, new, max_batch=4)
    rep.update_weights(new, "scaled")
    sp = SamplingParams(max_new_tokens=12, temperature=0.0)
    assert [r.token_ids for r in rep.generate(prompts, sp)] == [r.token_ids for r in single.generate(prompts, sp)]
    assert rep.weight_version == "scaled"


def test_replicas_are_checked(ckpt):
    from mpa_jax import sharding

    with pytest.raises(ValueError, match="replicas=64 but only"):
        Engine.from_pretrained(ckpt, replicas=64)
    with pytest.raises(ValueError, match="1 with a mesh"):
        Engine.from_pretrained(ckpt, mesh=sharding.make_mesh((2, 1, 1, 1), jax.devices()[:2]), replicas=2)


def test_rows_with_different_settings_share_a_batch_and_top_logprobs(engine):
    """generate_rows: greedy, hot, top-k and short rows in one call equal each run on its own; the top
    log-probs are the most likely ids of the same distribution, the sampled token's among them when greedy."""
    prompts = _prompts((4, 9, 6, 12), seed=5)
    rows = [SamplingParams(max_new_tokens=6, temperature=0.0), SamplingParams(max_new_tokens=12, temperature=1.5),
            SamplingParams(max_new_tokens=3, temperature=0.8, top_k=5), SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=(7,))]
    mixed = engine.generate_rows(prompts, rows, seeds=[1, 2, 3, 4], top_logprobs=3)
    for p, sp, seed, r in zip(prompts, rows, [1, 2, 3, 4], mixed):
        (alone,) = engine.generate([p], sp, seeds=[seed])
        assert r.token_ids == alone.token_ids and r.finish_reason == alone.finish_reason
        np.testing.assert_allclose(r.logprobs, alone.logprobs, atol=1e-5)
        assert len(r.top_logprobs) == len(r.token_ids) and all(len(t) == 3 for t in r.top_logprobs)
        for tok, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs):
            vals = [v for _, v in top]
            assert vals == sorted(vals, reverse=True) and lp <= vals[0] + 1e-5
            if tok in dict(top):
                assert abs(dict(top)[tok] - lp) < 1e-5
    assert all(r.token_ids[i] == r.top_logprobs[i][0][0] for r in mixed[:1] for i in range(6))  # greedy row: its token is the top one
    assert len(mixed[2].token_ids) == 3 and mixed[0].top_logprobs is not None and engine.generate(prompts[:1], rows[0])[0].top_logprobs is None


def test_generate_equals_the_whole_batch_program(engine):
    """The slot path (`generate`, a wrapper over `submit`) gives the whole-batch program's tokens, finish
    reasons and log-probs for the same seeds: greedy, hot, filtered and mixed rows, stops, top log-probs,
    more rows than slots (admitted as slots free up)."""
    prompts = _prompts((5, 23, 11, 3, 17, 8), seed=9)
    rows = [SamplingParams(max_new_tokens=20, temperature=0.0), SamplingParams(max_new_tokens=33, temperature=1.0),
            SamplingParams(max_new_tokens=12, temperature=0.8, top_k=7), SamplingParams(max_new_tokens=25, temperature=1.2, top_p=0.9),
            SamplingParams(max_new_tokens=40, temperature=1.0, stop_token_ids=(5, 9)), SamplingParams(max_new_tokens=9, temperature=0.5)]
    seeds = [11, 12, 13, 14, 15, 16]
    assert engine.slots < len(prompts)
    for top in (0, 2):
        got = engine.generate_rows(prompts, rows, seeds, top_logprobs=top)
        want = engine.generate_batch(prompts, rows, seeds, top_logprobs=top)
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason and g.matched_stop == w.matched_stop
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
            if top:
                assert [[i for i, _ in t] for t in g.top_logprobs] == [[i for i, _ in t] for t in w.top_logprobs]
    sp = SamplingParams(max_new_tokens=16, temperature=1.0)
    assert [r.token_ids for r in engine.generate(prompts, sp, seeds)] == [r.token_ids for r in engine.generate_batch(prompts, sp, seeds)]


def test_submit_streams_and_joins_the_running_batch(engine):
    """`submit` returns a future; `on_update` streams each chunk's tokens; a request submitted while a long
    one runs joins it and finishes first (counted: the long one has streamed only part of its tokens
    then); `stop()` ends a running request with its tokens so far."""
    import threading

    prompts = _prompts((9, 6, 12), seed=10)
    long_sp = SamplingParams(max_new_tokens=200, temperature=1.0)
    streamed: list[int] = []
    first = threading.Event()

    def on_update(u):
        streamed.extend(u.token_ids)
        first.set()

    long = engine.submit(prompts[0], long_sp, 3, on_update=on_update)
    assert first.wait(120)  # the long request is decoding
    short = engine.submit(prompts[1], SamplingParams(max_new_tokens=4, temperature=0.0), 4)
    r_short = short.result(120)
    assert len(streamed) < 200 and not long.done()  # it finished while the long one was still running
    r_long = long.result(120)
    assert streamed == r_long.token_ids and len(r_long.token_ids) == 200 and r_long.finish_reason == "length"
    assert r_short.token_ids == engine.generate_batch([prompts[1]], SamplingParams(max_new_tokens=4, temperature=0.0), [4])[0].token_ids
    assert r_long.token_ids == engine.generate_batch([prompts[0]], long_sp, [3])[0].token_ids
    # stop(): the result holds what was decoded until then.
    got: list[int] = []
    seen = threading.Event()
    fut = engine.submit(prompts[2], long_sp, 5, on_update=lambda u: (got.extend(u.token_ids), seen.set()))
    assert seen.wait(120)
    fut.stop()
    res = fut.result(120)
    assert res.finish_reason == "length" and 0 < len(res.token_ids) < 200 and res.token_ids == got
    assert not engine.busy


def test_weight_update_between_chunks_labels_every_result(ckpt):
    """A weight update while a request runs takes effect at the next chunk: the running result lists both
    versions (first: the one its first token came from); requests after it see only the new weights."""
    import threading

    engine = Engine.from_pretrained(ckpt, max_batch=4, weight_version="a")
    prompt = _prompts((7,), seed=11)[0]
    sp = SamplingParams(max_new_tokens=120, temperature=0.0)
    before = engine.generate([prompt], sp)[0]
    assert before.weight_version == "a" and before.weight_versions == ("a",)
    new = jax.tree.map(lambda x: x * 1.5, engine.params)
    seen, go = threading.Event(), threading.Event()

    def hold_first_chunk(u) -> None:  # on the loop's thread: the request stays mid-generation until the update waits
        if not seen.is_set():
            seen.set()
            assert go.wait(120)

    fut = engine.submit(prompt, sp, 0, on_update=hold_first_chunk)
    assert seen.wait(120)
    updater = threading.Thread(target=engine.update_weights, args=(new, "b"))
    updater.start()
    deadline = time.monotonic() + 120
    while engine.stats()["pausers"] == 0:  # wait until the update is queued at the chunk boundary
        assert time.monotonic() < deadline, "update_weights never reached the chunk boundary"
        time.sleep(0.01)
    go.set()
    updater.join(120)
    res = fut.result(120)
    assert res.weight_version == "a" and res.weight_versions == ("a", "b")
    n = next(i for i, (x, y) in enumerate(zip(res.token_ids, before.token_ids)) if x != y)  # the new weights took over
    assert 0 < n < 120
    after = engine.generate([prompt], sp)[0]
    assert after.weight_versions == ("b",) and after.token_ids == Engine(engine.cfg, new, max_batch=4).generate([prompt], sp)[0].token_ids


def test_engine_owns_its_weights(ckpt):
    """The engine copies what it is given (constructor and update_weights): a caller that deletes or
    donates its arrays afterwards leaves the engine working."""
    params = models.from_pretrained(ckpt).params
    params = jax.tree.map(jax.numpy.asarray, params)
    engine = Engine(models.from_pretrained(ckpt).cfg, params, max_batch=2)
    prompts = _prompts((5,), seed=12)
    sp = SamplingParams(max_new_tokens=6, temperature=0.0)
    ref = engine.generate(prompts, sp)[0].token_ids
    mine = jax.tree.map(lambda x: x + 0, params)
    engine.update_weights(mine, "mine")
    for leaf in jax.tree.leaves(params) + jax.tree.leaves(mine):
        leaf.delete()
    assert engine.generate(prompts, sp)[0].token_ids == ref
    assert engine.max_positions == engine.cfg.max_position_embeddings and engine.vocab_limit == VOCAB
    assert engine.replicas == 1 and engine.replica_mesh is None and engine.param_sharding is not None


def test_idle_loop_thread_ends_and_restarts_and_close_answers_the_queue(ckpt):
    """The slot loop's thread ends when idle (an engine nobody uses holds no thread) and the next request
    starts it again; `close()` frees the slots and a later request builds them again."""
    from mpa_jax.rollout.slots import timed_wait

    engine = Engine.from_pretrained(ckpt, max_batch=2, idle_exit_s=0.0)
    prompts = _prompts((6, 4), seed=13)
    sp = SamplingParams(max_new_tokens=5, temperature=0.0)
    first = engine.generate(prompts, sp)
    assert timed_wait(lambda: engine.stats()["loop_thread"] == 0.0, 60)
    assert [r.token_ids for r in engine.generate(prompts, sp)] == [r.token_ids for r in first]
    engine.close()
    assert [r.token_ids for r in engine.generate(prompts, sp)] == [r.token_ids for r in first]
    engine.close()


def test_weights_from_the_host_are_copied_too(ckpt):
    """`jax.device_get` of a CPU array is a view of its buffer and `device_put` of numpy may alias it:
    an engine given host copies of a learner's arrays still shares no buffer with them."""
    params = jax.tree.map(jax.numpy.asarray, models.from_pretrained(ckpt).params)
    pointers = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(params)}
    engine = Engine(models.from_pretrained(ckpt).cfg, jax.device_get(params), max_batch=2)
    engine.update_weights(jax.device_get(params), "host")
    assert not pointers & {x.unsafe_buffer_pointer() for x in jax.tree.leaves(engine.params)}


def test_a_batch_on_an_idle_engine_is_bitwise_reproducible(ckpt, engine):
    """What an idle engine samples for a batch does not depend on what it ran before (bitwise: tokens
    and log-probs), so a resumed RL run samples what the original did: the ring starts over when idle and
    a batch reaches the slots as one group."""
    prompts = _prompts((7, 30, 12, 4, 19), seed=14)
    sp = SamplingParams(max_new_tokens=21, temperature=1.0)
    engine.generate(_prompts((25, 3, 9), seed=15), sp.replace(max_new_tokens=13), seeds=[7, 8, 9])  # something else first
    used = engine.generate(prompts, sp, seeds=[1, 2, 3, 4, 5])
    fresh = Engine.from_pretrained(ckpt, max_batch=4).generate(prompts, sp, seeds=[1, 2, 3, 4, 5])
    assert [r.token_ids for r in used] == [r.token_ids for r in fresh]
    assert [r.logprobs for r in used] == [r.logprobs for r in fresh]


def test_other_prefill_chunks_give_the_same_tokens(ckpt):
    """`prefill_chunk` (tokens per row of one prefill call) changes only how a prompt is split: 5-token
    chunks give the default's tokens and log-probs; a bad size is named."""
    fine = Engine.from_pretrained(ckpt, max_batch=4, prefill_chunk=5)
    prompts = _prompts((5, 23, 40, 3, 60, 17, 33, 9, 47), seed=21)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0)
    seeds = list(range(len(prompts)))
    got, want = fine.generate(prompts, sp, seeds), Engine.from_pretrained(ckpt, max_batch=4).generate_batch(prompts, sp, seeds)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine.from_pretrained(ckpt, max_batch=4, prefill_chunk=0)
    import os

    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.engines import RolloutSetupError, make_engine

    config = load_config_file(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "tiny.py"))
    config.rollout.prefill_chunk = 0
    with pytest.raises(RolloutSetupError, match="prefill_chunk must be >= 1, got 0"):
        make_engine(config, ckpt)
