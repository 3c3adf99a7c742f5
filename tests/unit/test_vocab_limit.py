"""One vocabulary rule: ids the tokenizer cannot produce (embedding padding) are never sampled by the
engine, in any path, and the learner's log-probs leave them out of the softmax the same way."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from mpa_jax import models  # noqa: E402
from mpa_jax.kernels.logprobs import chunked_logprobs, naive_logprobs  # noqa: E402
from mpa_jax.rollout import sampling  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.rollout.testing import tiny_checkpoint  # noqa: E402
from mpa_jax.rollout.types import EngineError, SamplingParams  # noqa: E402

VOCAB = 512  # embedding rows
LIMIT = 300  # the "tokenizer": ids >= 300 are padding


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(str(tmp_path_factory.mktemp("hf") / "m"), vocab_size=VOCAB, seed=5)


def test_kernel_limit_equals_softmax_over_the_first_columns_and_grads():
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 100)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 61, size=(2, 5)), jnp.int32)
    for limit, chunk in ((61, 16), (100, 32), (1, 8)):  # overlapping last chunk, no limit, one column
        yl = jnp.minimum(y, limit - 1)
        ref_lp, ref_ent = naive_logprobs(h, w[:, :limit], yl, temperature=1.3)  # the truncated vocabulary
        lp, ent = chunked_logprobs(h, w, yl, chunk_size=chunk, temperature=1.3, vocab_limit=limit)
        nlp, nent = naive_logprobs(h, w, yl, temperature=1.3, vocab_limit=limit)
        np.testing.assert_allclose(lp, ref_lp, atol=1e-5)
        np.testing.assert_allclose(ent, ref_ent, atol=1e-5)
        np.testing.assert_allclose(nlp, ref_lp, atol=1e-5)
        np.testing.assert_allclose(nent, ref_ent, atol=1e-5)
        loss = lambda f: lambda h, w: (f(h, w)[0].sum() + 0.3 * f(h, w)[1].sum())  # noqa: E731
        gh, gw = jax.grad(loss(lambda h, w: chunked_logprobs(h, w, yl, chunk_size=chunk, temperature=1.3, vocab_limit=limit)), (0, 1))(h, w)
        rh, rw = jax.grad(loss(lambda h, w: naive_logprobs(h, w, yl, temperature=1.3, vocab_limit=limit)), (0, 1))(h, w)
        np.testing.assert_allclose(gh, rh, atol=1e-4)
        np.testing.assert_allclose(gw, rw, atol=1e-4)
        assert not np.asarray(gw[:, limit:]).any()  # padding columns get no gradient
    with pytest.raises(ValueError, match="vocab_limit"):
        chunked_logprobs(h, w, y, vocab_limit=101)
    with pytest.raises(ValueError, match="vocab_limit"):
        naive_logprobs(h, w, y, vocab_limit=0)


def test_mask_vocab_sends_padding_to_minus_inf():
    z = jnp.zeros((2, 10))
    m = np.asarray(sampling.mask_vocab(z, 7))
    assert np.isfinite(m[:, :7]).all() and np.isneginf(m[:, 7:]).all()
    assert sampling.mask_vocab(z, None) is z and sampling.mask_vocab(z, 10) is z


def test_engine_never_samples_padding_and_logprobs_equal_learner(ckpt, replicas=2):
    """Temperatures 1 and 2 over a random model whose padding rows hold ~40% of the vocabulary: without
    the mask, hundreds of the sampled ids would be padding. Greedy and top-k paths too; two weight
    replicas (the CPU default), so the shard_map path is the one checked."""
    engine = Engine.from_pretrained(ckpt, max_batch=8, replicas=replicas, vocab_limit=LIMIT)
    assert engine.vocab_limit == LIMIT
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, LIMIT, n).tolist() for n in (3, 9, 5, 14, 7, 4, 11, 6)]
    cfg, params = engine.cfg, engine.params

    @functools.partial(jax.jit, static_argnums=2)
    def learner(params, ids, temperature):
        hidden = models.hidden_states(cfg, params, ids[:, :-1])
        return chunked_logprobs(hidden, models.unembedding(cfg, params), ids[:, 1:], chunk_size=128,
                                temperature=temperature, vocab_limit=LIMIT)[0]

    n_tokens = 0
    for temperature in (1.0, 2.0):
        results = engine.generate(prompts, SamplingParams(max_new_tokens=48, temperature=temperature, seed=7))
        seqs = [p + r.token_ids for p, r in zip(prompts, results)]
        assert max(max(r.token_ids) for r in results) < LIMIT
        n_tokens += sum(len(r.token_ids) for r in results)
        ids = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
        logp = np.asarray(learner(params, ids, temperature))
        for i, (p, r) in enumerate(zip(prompts, results)):
            np.testing.assert_allclose(r.logprobs, logp[i, len(p) - 1 : len(seqs[i]) - 1], atol=1e-4, rtol=0)
    assert n_tokens == 2 * 8 * 48
    for sp in (SamplingParams(max_new_tokens=16, temperature=0.0), SamplingParams(max_new_tokens=16, temperature=2.0, top_k=400)):
        assert max(max(r.token_ids) for r in engine.generate(prompts, sp)) < LIMIT


def test_engine_without_limit_does_sample_padding_and_bad_limits_are_one_error(ckpt):
    """The mask is what keeps the ids in range: the same model and seed without a limit sample padding."""
    engine = Engine.from_pretrained(ckpt, max_batch=8)
    assert engine.vocab_limit == VOCAB
    out = engine.generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=32, temperature=2.0, seed=7))
    assert max(max(r.token_ids) for r in out) >= LIMIT
    with pytest.raises(EngineError, match="tokenizer has 513 ids but the model's embedding has only 512 rows"):
        Engine(engine.cfg, engine.params, vocab_limit=VOCAB + 1)
    with pytest.raises(EngineError, match="positive int"):
        Engine(engine.cfg, engine.params, vocab_limit=0)


def test_make_engine_takes_the_tokenizer_size_and_refuses_a_larger_tokenizer(ckpt):
    import os

    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.engines import RolloutSetupError, check_engine_vocab, make_engine

    class Tok:  # only the size matters here
        def __init__(self, n):
            self.vocab_size = n

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = load_config_file(os.path.join(repo, "configs", "tiny.py"))
    config.rollout.replicas = 1
    engine = make_engine(config, ckpt, tokenizer=Tok(LIMIT))
    assert engine.vocab_limit == LIMIT
    check_engine_vocab(engine, Tok(LIMIT))
    with pytest.raises(RolloutSetupError, match="vocab_limit=299"):
        check_engine_vocab(engine, Tok(LIMIT - 1))
    with pytest.raises(RolloutSetupError, match="tokenizer has 600 ids but the model's embedding has only 512 rows"):
        make_engine(config, ckpt, tokenizer=Tok(600))
    with pytest.raises(RolloutSetupError, match="5000 ids .* only 4096 rows"):
        make_engine(config, None, tokenizer=Tok(5000))


def test_rollout_compute_dtype_sets_the_engines_own_and_is_validated(ckpt):
    """`rollout.compute_dtype`: "" keeps the model's compute dtype, a dtype overrides the engine's alone (the
    learner's config is not touched); an unknown value is refused when the config is loaded, naming the key."""
    import os

    from mpa_jax.config import ConfigError, load_config_file, validate
    from mpa_jax.rollout.engines import make_engine

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = load_config_file(os.path.join(root, "configs", "tiny.py"))
    config.rollout.batch_size = 2
    config.rollout.max_total_tokens = 64
    model = models.from_pretrained(ckpt, dtype="float32")
    learner_cfg = model.cfg.replace(compute_dtype="bfloat16")
    outs = {}
    for compute in ("", "float32"):
        config.rollout.compute_dtype = compute
        engine = make_engine(config, params=model.params, model_cfg=learner_cfg, version="v0")
        assert engine.cfg.compute_dtype == (compute or "bfloat16")
        outs[compute] = engine.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=6, temperature=0.0), [0])[0]
        engine.close()
    assert learner_cfg.compute_dtype == "bfloat16"
    reference = Engine(model.cfg, model.params, slots=2, slot_len=64, max_batch=2)  # a float32 model
    want = reference.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=6, temperature=0.0), [0])[0]
    reference.close()
    assert outs["float32"].token_ids == want.token_ids
    np.testing.assert_allclose(outs["float32"].logprobs, want.logprobs, atol=1e-5)
    config.rollout.compute_dtype = "float16"
    with pytest.raises(ConfigError, match="rollout.compute_dtype"):
        validate(config)
