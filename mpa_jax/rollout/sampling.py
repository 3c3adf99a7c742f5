"""Pure jax sampling functions over a batch of next-token logits [B, V].

The behaviour log-prob of a token is always the full-vocabulary log-softmax of `logits / temperature`
(raw logits when greedy): filters (top-k, top-p) only decide which token is drawn. That is the number
the learner recomputes with `kernels.logprobs.chunked_logprobs(..., temperature=T, vocab_limit=L)`:
the engine masks ids >= L (`mask_vocab`) before both the draw and the log-prob.

Sampling uses inverse-CDF draws: one uniform per row per step instead of a Gumbel variate per
vocabulary entry, which keeps the per-step random-number cost independent of the vocabulary. The
distribution is exactly the softmax (after filtering). Argmax and the CDF avoid the XLA CPU ops that
are slow at small batch (variadic argmax reductions, long cumsums); see `argmax` and `draw`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _col(x: jax.Array) -> jax.Array:
    """A scalar or per-row [B] knob as a column that broadcasts against [B, V]."""
    return jnp.reshape(x, (-1, 1))


def scaled_logits(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """`logits / temperature` in float32; temperature (a scalar or per row [B]) 0 (greedy) leaves the
    logits unscaled."""
    t = _col(temperature)
    t = jnp.where(t > 0.0, t, 1.0).astype(jnp.float32)
    return logits.astype(jnp.float32) / t


def mask_vocab(logits: jax.Array, vocab_limit: int | None) -> jax.Array:
    """`logits` [B, V] with the ids >= `vocab_limit` (static) at -inf: ids the tokenizer cannot produce.

    The embedding of a model is often padded past its tokenizer (the tiny model: 4,096 rows for a
    3,632-id tokenizer); those rows are never sampled, and the learner's log-probs
    (`kernels.logprobs.chunked_logprobs(..., vocab_limit=)`) leave them out of the softmax too.
    None or V leaves the logits as they are.
    """
    vocab = logits.shape[-1]
    if vocab_limit is None or vocab_limit >= vocab:
        return logits
    return jnp.where(jnp.arange(vocab) < vocab_limit, logits, -jnp.inf)


def filter_logits(z: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask (to -inf) what top-k / top-p exclude; `top_k <= 0` and `top_p >= 1` disable each filter.

    `z` is already temperature-scaled; the knobs are scalars or per row [B]. The most likely token
    always survives.
    """
    vocab = z.shape[-1]
    sorted_z = jnp.sort(z, axis=-1)[:, ::-1]  # descending
    top_k = _col(top_k)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab).astype(jnp.int32)
    kth = jnp.take_along_axis(sorted_z, jnp.broadcast_to(k - 1, (z.shape[0], 1)), axis=-1)
    probs = jax.nn.softmax(sorted_z, axis=-1)
    # Keep a sorted entry while the mass *before* it is below top_p (so the first always stays).
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < _col(top_p)
    n_keep = jnp.maximum(jnp.sum(keep_sorted, axis=-1, keepdims=True), 1)
    pth = jnp.take_along_axis(sorted_z, n_keep - 1, axis=-1)
    threshold = jnp.maximum(kth, pth)
    return jnp.where(z >= threshold, z, -jnp.inf)


def argmax(z: jax.Array, zmax: jax.Array | None = None) -> jax.Array:
    """Index of the largest entry per row of `z` [B, V] (lowest index on ties, as jnp.argmax).

    Two plain reductions (max, then min index equal to it): XLA's CPU argmax is a variadic
    (value, index) reduction that does not vectorise and cost ~8x more per decode step. `zmax`
    ([B, 1], the row max) skips the first when the caller has it.
    """
    vocab = z.shape[-1]
    m = jnp.max(z, axis=-1, keepdims=True) if zmax is None else zmax
    idx = jnp.min(jnp.where(z == m, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)
    return jnp.minimum(idx, vocab - 1).astype(jnp.int32)


def _block_size(vocab: int) -> int:
    """Block width ~sqrt(V) (a multiple of 8) for the two-level CDF."""
    b = int(vocab**0.5)
    return max(8, (b + 7) // 8 * 8)


def draw(z: jax.Array, uniforms: jax.Array) -> jax.Array:
    """Sample one token per row of `z` [B, V] by inverting the softmax CDF at `uniforms` [B] in [0, 1).

    Two levels (block sums, then one block) so that no prefix sum runs over the whole vocabulary:
    XLA lowers a long cumsum on CPU to a quadratic reduce-window, which dominated small decode steps.
    """
    return _draw(z, jnp.max(z, axis=-1, keepdims=True), uniforms)[0]


def _draw(z: jax.Array, zmax: jax.Array, uniforms: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`draw` given the row max [B, 1]; also returns the row sums of exp(z - zmax) [B]."""
    bsz, vocab = z.shape
    blk = _block_size(vocab)
    nb = -(-vocab // blk)
    probs = jnp.exp(z - zmax)  # unnormalised; -inf -> 0
    probs = jnp.pad(probs, ((0, 0), (0, nb * blk - vocab))).reshape(bsz, nb, blk)
    block_mass = jnp.sum(probs, axis=-1)  # [B, nb]
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    u = uniforms * block_cdf[:, -1]  # scale by the total so rounding never runs past the end
    bi = jnp.minimum(jnp.sum(block_cdf <= u[:, None], axis=-1), nb - 1).astype(jnp.int32)
    start = jnp.take_along_axis(block_cdf - block_mass, bi[:, None], axis=-1)[:, 0]
    row = jnp.take_along_axis(probs, bi[:, None, None], axis=1)[:, 0]  # [B, blk]
    row_cdf = jnp.cumsum(row, axis=-1)
    j = jnp.minimum(jnp.sum(row_cdf <= (u - start)[:, None], axis=-1), blk - 1).astype(jnp.int32)
    idx = jnp.minimum(bi * blk + j, vocab - 1)
    # Rounding can land on a zero-probability (filtered or underflowed) entry only at a zero-width
    # CDF step; fall back to the argmax there so an excluded token is never emitted.
    ok = jnp.take_along_axis(row, j[:, None], axis=-1)[:, 0] > 0
    return jnp.where(ok, idx, argmax(z, zmax)), block_cdf[:, -1]


def row_uniforms(keys: jax.Array, step: jax.Array) -> jax.Array:
    """One uniform per row from per-row base keys [B] (typed keys) folded with the decode step (a
    scalar, or one per row [B]).

    Folding in the step (not threading a split key) makes token t of a row depend only on the row's
    seed and t, so results do not depend on batch composition or padding.
    """
    # `step` may also be per row [B] (the server's slot loop, where every row is at its own step).
    steps = jnp.broadcast_to(jnp.asarray(step, jnp.int32), keys.shape)
    return jax.vmap(lambda k, s: jax.random.uniform(jax.random.fold_in(k, s), (), jnp.float32))(keys, steps)


def sample_step(
    logits: jax.Array,
    keys: jax.Array,
    step: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    greedy: bool,
    filtered: bool,
    mixed: bool = False,
    n_top: int = 0,
) -> tuple[jax.Array, ...]:
    """Pick the next token for each row and return `(tokens [B] int32, logprobs [B] float32)`, plus
    `(top_ids [B, n_top], top_logprobs [B, n_top])` when `n_top > 0`.

    `greedy`, `filtered`, `mixed` (some rows have temperature 0 while others sample) and `n_top` are
    static (they pick the compiled path); the numeric knobs (scalars or per row [B]) are traced so
    that changing them never recompiles. The top log-probs are of the same distribution as the
    token's (logits / temperature over the allowed vocabulary).
    """
    # One max and one exp pass over [B, V] serve both the token choice and its log-prob
    # (log p = z_tok - max - log(sum exp(z - max))); each extra pass is a sizeable part of a small step.
    z = logits.astype(jnp.float32) if greedy else scaled_logits(logits, temperature)
    zmax = jnp.max(z, axis=-1, keepdims=True)
    if not greedy and not filtered:
        tokens, total = _draw(z, zmax, row_uniforms(keys, step))
    else:
        tokens = argmax(z, zmax) if greedy else draw(filter_logits(z, top_k, top_p), row_uniforms(keys, step))
        total = jnp.sum(jnp.exp(z - zmax), axis=-1)
    if mixed and not greedy:
        # Rows at temperature 0 take the argmax of their (unscaled) logits.
        is_greedy = jnp.broadcast_to(jnp.reshape(temperature, (-1,)), tokens.shape) <= 0.0
        tokens = jnp.where(is_greedy, argmax(z, zmax), tokens)
    picked = zmax[:, 0] if greedy else jnp.take_along_axis(z, tokens[:, None], axis=-1)[:, 0]
    lse = zmax[:, 0] + jnp.log(total)
    if n_top <= 0:
        return tokens, picked - lse
    top_z, top_ids = jax.lax.top_k(z, n_top)
    return tokens, picked - lse, top_ids.astype(jnp.int32), top_z - lse[:, None]
