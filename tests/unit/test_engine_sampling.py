"""Sampling functions of the embedded engine: filters, inverse-CDF draws, full-vocabulary log-probs."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp  # noqa: E402

from mpa_jax.rollout import sampling  # noqa: E402

LOGITS = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05], [0.05, 0.1, 0.15, 0.2, 0.5]], np.float32))


def test_filters_keep_what_top_k_and_top_p_allow():
    z = jnp.asarray(LOGITS)
    kept = lambda k, p: np.isfinite(np.asarray(sampling.filter_logits(z, jnp.int32(k), jnp.float32(p))))  # noqa: E731
    assert kept(-1, 1.0).all()
    np.testing.assert_array_equal(kept(2, 1.0), [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])
    # top_p 0.6: 0.5 alone is below it, so the next (0.2) joins; the mass before 0.15 is 0.7 >= 0.6.
    np.testing.assert_array_equal(kept(-1, 0.6), [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(kept(-1, 0.3), [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(kept(1, 1.0), kept(-1, 1e-6))  # the most likely token always survives


def test_inverse_cdf_draws_follow_the_softmax():
    n = 4000
    z = jnp.asarray(np.repeat(LOGITS[:1], n, axis=0))
    u = (np.arange(n, dtype=np.float32) + 0.5) / n  # exact quantiles: frequencies equal probabilities
    counts = np.bincount(np.asarray(sampling.draw(z, jnp.asarray(u))), minlength=5) / n
    np.testing.assert_allclose(counts, [0.5, 0.2, 0.15, 0.1, 0.05], atol=2 / n)
    # A filtered (-inf) entry is never drawn, even at u -> 1.
    zf = sampling.filter_logits(z, jnp.int32(2), jnp.float32(1.0))
    assert set(np.asarray(sampling.draw(zf, jnp.asarray(u)))) == {0, 1}


def test_sample_step_logprobs_are_of_logits_over_temperature_unfiltered():
    z = jnp.asarray(LOGITS)
    keys = jax.vmap(jax.random.key)(jnp.arange(2, dtype=jnp.uint32))
    t = jnp.float32(0.5)
    tok, lp = sampling.sample_step(z, keys, jnp.int32(0), t, jnp.int32(2), jnp.float32(1.0), greedy=False, filtered=True)
    ref = jax.nn.log_softmax(z / 0.5, axis=-1)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref)[np.arange(2), np.asarray(tok)], atol=1e-6)
    tok_g, lp_g = sampling.sample_step(z, keys, jnp.int32(0), jnp.float32(0.0), jnp.int32(-1), jnp.float32(1.0), greedy=True, filtered=False)
    np.testing.assert_array_equal(np.asarray(tok_g), [0, 4])
    np.testing.assert_allclose(np.asarray(lp_g), np.log([0.5, 0.5]), atol=1e-6)
