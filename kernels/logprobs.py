"""Log-probabilities and entropy of target tokens over vocabulary chunks.

`chunked_logprobs` never materialises [B, T, V] logits in float32, in the forward or the backward
pass: a scan walks the vocabulary `chunk_size` columns at a time keeping an online log-sum-exp, and
a custom VJP recomputes each chunk's logits in the backward scan. Live memory is O(B*T*chunk) for
logits plus the [D, V] weight gradient. `naive_logprobs` is the plain reference.
`vocab_parallel_logprobs` is the same computation over a vocabulary-sharded unembedding (shard_map):
each device reads only its own columns and devices exchange per-token scalars, never logits or weights.

`vocab_limit` (both functions): columns >= vocab_limit are outside the softmax, as if their logits
were -inf. These are the embedding's padding rows that the tokenizer can never produce; the rollout
engines mask the same ids when sampling (`rollout.sampling.mask_vocab`), so behaviour and learner
log-probs stay equal. The chunked kernel simply walks only the first vocab_limit columns.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def naive_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Reference: full float32 logits, log_softmax, gather; returns (logp, entropy) [B, T]."""
    limit = _check_limit(vocab_limit, unembed.shape[1], "naive_logprobs")
    logits = jnp.einsum("btd,dv->btv", hidden, unembed, preferred_element_type=jnp.float32) / temperature
    allowed = jnp.arange(unembed.shape[1]) < limit
    logits = jnp.where(allowed, logits, -jnp.inf)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    safe = jnp.where(allowed, logp_all, 0.0)  # no -inf * 0 in the entropy or its gradient
    entropy = -jnp.sum(jnp.where(allowed, jnp.exp(safe) * safe, 0.0), axis=-1)
    return logp, entropy


def _check_limit(vocab_limit: int | None, vocab: int, name: str) -> int:
    """The number of columns inside the softmax: `vocab_limit`, or all V when None."""
    if vocab_limit is None:
        return vocab
    if isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int) or not 1 <= vocab_limit <= vocab:
        raise ValueError(f"{name}: vocab_limit must be an int in [1, {vocab}] (the unembedding's columns), got {vocab_limit!r}")
    return vocab_limit


def chunked_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and the entropy of the softmax(hidden @ unembed / temperature) distribution.

    hidden [B, T, D] and unembed [D, V] in any float dtype (matmuls accumulate in float32); targets
    [B, T] int in [0, vocab_limit) (out-of-range targets, e.g. an ignore index, give meaningless
    values that the caller must mask). `vocab_limit` (default V): only columns below it take part in
    the softmax; the gradient of the others is zero. Returns float32 (logp [B, T], entropy [B, T]);
    differentiable with respect to hidden and unembed.
    """
    if hidden.ndim != 3 or unembed.ndim != 2 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"chunked_logprobs: expected hidden [B,T,D], unembed [D,V], targets [B,T]; got "
            f"{hidden.shape}, {unembed.shape}, {targets.shape}"
        )
    if hidden.shape[-1] != unembed.shape[0]:
        raise ValueError(f"chunked_logprobs: hidden width {hidden.shape[-1]} != unembed rows {unembed.shape[0]}")
    if chunk_size <= 0 or temperature <= 0:
        raise ValueError(f"chunked_logprobs: chunk_size ({chunk_size}) and temperature ({temperature}) must be > 0")
    limit = _check_limit(vocab_limit, unembed.shape[1], "chunked_logprobs")
    b, t, d = hidden.shape
    chunk = min(int(chunk_size), limit)
    logp, ent = _chunked(
        hidden.reshape(b * t, d), unembed, targets.reshape(b * t).astype(jnp.int32), chunk, float(temperature), limit
    )
    return logp.reshape(b, t), ent.reshape(b, t)


def _chunk_bounds(c: jax.Array, chunk: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """Start column of chunk c (clamped so the slice stays in range) and the mask of its new columns.

    The last chunk overlaps the previous one when chunk does not divide V; the overlapping columns are
    masked out, which avoids padding (and thus copying) the [D, V] matrix.
    """
    start = jnp.minimum(c * chunk, vocab - chunk)
    cols = start + jnp.arange(chunk)
    return start, cols >= c * chunk


def _weight_chunk(w: jax.Array, start: jax.Array, chunk: int) -> jax.Array:
    """Columns [start, start+chunk) of w.

    16-bit weights are sliced as raw bits: on CPU, XLA otherwise converts the whole bf16 matrix to
    float32 once before the loop (a [D, V] float32 copy), since its bf16 ops are upcast. Other
    backends slice 16-bit floats natively, where the bit view would only add a copy.
    """
    if w.dtype.itemsize == 2 and jax.default_backend() == "cpu":
        bits = jax.lax.bitcast_convert_type(w, jnp.uint16)
        return jax.lax.bitcast_convert_type(jax.lax.dynamic_slice_in_dim(bits, start, chunk, axis=1), w.dtype)
    return jax.lax.dynamic_slice_in_dim(w, start, chunk, axis=1)


def _chunk_logits(h: jax.Array, w: jax.Array, start: jax.Array, chunk: int, temperature: float) -> jax.Array:
    wc = _weight_chunk(w, start, chunk)
    return jnp.dot(h, wc.astype(h.dtype), preferred_element_type=jnp.float32) / temperature


def _forward_stats(h, w, y, chunk, temperature, vocab):
    """Online pass over the first `vocab` columns of w: (logp, entropy, lse) per row."""
    n = h.shape[0]
    num_chunks = -(-vocab // chunk)

    def body(carry, c):
        m, s, sl, ty = carry
        start, valid = _chunk_bounds(c, chunk, vocab)
        logits = jnp.where(valid[None, :], _chunk_logits(h, w, start, chunk, temperature), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(logits - m_new[:, None])
        s = s * scale + jnp.sum(e, axis=1)
        # sum of e*l with masked columns contributing 0 (avoid 0 * -inf)
        sl = sl * scale + jnp.sum(jnp.where(valid[None, :], e * logits, 0.0), axis=1)
        local = y - start
        hit = (local >= 0) & (local < chunk) & (y >= c * chunk)
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, chunk - 1)[:, None], axis=1)[:, 0]
        ty = jnp.where(hit, picked, ty)
        return (m_new, s, sl, ty), None

    init = (
        jnp.full((n,), -jnp.inf, jnp.float32),
        jnp.zeros((n,), jnp.float32),
        jnp.zeros((n,), jnp.float32),
        jnp.zeros((n,), jnp.float32),
    )
    (m, s, sl, ty), _ = jax.lax.scan(body, init, jnp.arange(num_chunks))
    lse = m + jnp.log(s)
    return ty - lse, lse - sl / s, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunked(h, w, y, chunk, temperature, vocab):
    logp, ent, _ = _forward_stats(h, w, y, chunk, temperature, vocab)
    return logp, ent


def _chunked_fwd(h, w, y, chunk, temperature, vocab):
    logp, ent, lse = _forward_stats(h, w, y, chunk, temperature, vocab)
    return (logp, ent), (h, w, y, ent, lse)


def _chunked_bwd(chunk, temperature, vocab, res, grads):
    h, w, y, ent, lse = res
    g_logp, g_ent = grads
    num_chunks = -(-vocab // chunk)
    h32 = h.astype(jnp.float32)  # hoisted out of the loop

    def body(carry, c):
        dh, dw = carry
        start, valid = _chunk_bounds(c, chunk, vocab)
        wc = _weight_chunk(w, start, chunk)
        logits = jnp.dot(h, wc.astype(h.dtype), preferred_element_type=jnp.float32) / temperature
        logp = logits - lse[:, None]
        p = jnp.exp(logp)
        onehot = (jnp.arange(chunk)[None, :] + start) == y[:, None]
        # d logp_y / d l_k = [k == y] - p_k;  d H / d l_k = -p_k (log p_k + H)
        dl = g_logp[:, None] * (onehot.astype(jnp.float32) - p) - g_ent[:, None] * p * (logp + ent[:, None])
        dl = jnp.where(valid[None, :], dl, 0.0) / temperature
        dh = dh + jnp.dot(dl, wc.astype(jnp.float32).T)
        # Each vocabulary column's gradient is complete within its chunk, so it is cast to the weight
        # dtype at once and written in place (columns shared with the previous chunk keep their value).
        dwc = jnp.dot(h32.T, dl).astype(dw.dtype)
        old = jax.lax.dynamic_slice_in_dim(dw, start, chunk, axis=1)
        dw = jax.lax.dynamic_update_slice_in_dim(dw, jnp.where(valid[None, :], dwc, old), start, axis=1)
        return (dh, dw), None

    init = (jnp.zeros(h.shape, jnp.float32), jnp.zeros(w.shape, w.dtype))
    (dh, dw), _ = jax.lax.scan(body, init, jnp.arange(num_chunks))
    return dh.astype(h.dtype), dw, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


# ---- vocabulary-parallel form ---------------------------------------------------------------------------
def vocab_parallel_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    mesh: jax.sharding.Mesh,
    vocab_axes: tuple[str, ...],
    batch_axes: tuple[str, ...] = (),
    chunk_size: int = 4096,
    temperature: float = 1.0,
    vocab_limit: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`chunked_logprobs` with the unembedding's vocabulary sharded over the mesh axes `vocab_axes`.

    Each device walks only its own [D, V / n] columns in chunks (online log-sum-exp, as
    `chunked_logprobs`), and the per-row statistics (max, sum of exp, sum of p*logit, target logit)
    are combined over `vocab_axes` with one pmax and three psums of [rows] scalars. No device ever
    holds the full [D, V] unembedding or any [rows, V] logits; the backward pass recomputes each
    chunk (jax.checkpoint) and psums only the [rows, D] hidden-state gradient. Rows are split over
    `batch_axes`. Same arguments and results as `chunked_logprobs` otherwise.
    """
    b, t, d = hidden.shape
    vocab = unembed.shape[1]
    limit = _check_limit(vocab_limit, vocab, "vocab_parallel_logprobs")
    n_shards = 1
    for a in vocab_axes:
        n_shards *= mesh.shape[a]
    if vocab % n_shards:
        raise ValueError(f"vocab_parallel_logprobs: vocabulary {vocab} does not split over {n_shards} devices of {vocab_axes}")
    local = vocab // n_shards
    chunk = _divisor_chunk(local, int(chunk_size))
    P = jax.sharding.PartitionSpec
    bspec = (batch_axes if len(batch_axes) > 1 else batch_axes[0]) if batch_axes else None
    vspec = vocab_axes if len(vocab_axes) > 1 else vocab_axes[0]

    def body(h, w, y):
        bl = h.shape[0]
        offset = jax.lax.axis_index(vocab_axes) * local
        logp, ent = _local_then_combine(h.reshape(bl * t, d), w, y.reshape(bl * t).astype(jnp.int32), offset, chunk,
                                        float(temperature), limit, vocab_axes)
        return logp.reshape(bl, t), ent.reshape(bl, t)

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(bspec, None, None), P(None, vspec), P(bspec, None)),
                       out_specs=(P(bspec, None), P(bspec, None)))
    return fn(hidden, unembed, targets)


def _divisor_chunk(n: int, want: int) -> int:
    """The largest divisor of n that is <= want (chunks then tile the local columns exactly)."""
    want = max(1, min(want, n))
    for c in range(want, 0, -1):
        if n % c == 0 and (c >= want // 4 or c == n):
            return c
    return n if n <= want else want


def _local_then_combine(h, w, y, offset, chunk, temperature, limit, axes):
    """Per-row (logp, entropy) over the local columns [offset, offset + local), combined over `axes`."""
    n, d = h.shape
    local = w.shape[1]
    if local % chunk:  # no exact divisor: pad the local columns (masked), a copy of the local shard only
        pad = -local % chunk
        w = jnp.pad(w, ((0, 0), (0, pad)))
    num = w.shape[1] // chunk
    w_chunks = w.reshape(d, num, chunk).transpose(1, 0, 2)  # [num, D, chunk]: scanned over, so its gradient stacks

    @jax.checkpoint
    def step(carry, xs):
        m, s, sl, ty = carry
        wc, c = xs
        start = offset + c * chunk
        cols = start + jnp.arange(chunk)
        valid = (cols < limit) & (cols - offset < local)
        logits = jnp.dot(h, wc.astype(h.dtype), preferred_element_type=jnp.float32) / temperature
        logits = jnp.where(valid[None, :], logits, -jnp.inf)
        # The running max only keeps exp() in range: the result does not depend on it, so it carries no gradient.
        m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(logits, axis=1)))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(logits - m_new[:, None])
        s = s * scale + jnp.sum(e, axis=1)
        sl = sl * scale + jnp.sum(jnp.where(valid[None, :], e * logits, 0.0), axis=1)
        rel = y - start
        hit = (rel >= 0) & (rel < chunk)
        picked = jnp.take_along_axis(logits, jnp.clip(rel, 0, chunk - 1)[:, None], axis=1)[:, 0]
        ty = ty + jnp.where(hit, picked, 0.0)
        return (m_new, s, sl, ty), None

    # The carries vary over every mesh axis the rows and columns do (shard_map's type check for scan).
    zero = jnp.zeros((n,), jnp.float32) + jnp.zeros_like(h[:, 0], jnp.float32) + offset.astype(jnp.float32) * 0.0
    init = (zero - 1e30, zero, zero, zero)
    (m, s, sl, ty), _ = jax.lax.scan(step, init, (w_chunks, jnp.arange(num)))
    big = jax.lax.stop_gradient(jax.lax.pmax(m, axes))
    rescale = jnp.exp(m - big)
    total = jax.lax.psum(s * rescale, axes)
    lse = big + jnp.log(total)
    logp = jax.lax.psum(ty, axes) - lse
    ent = lse - jax.lax.psum(sl * rescale, axes) / total
    return logp, ent
