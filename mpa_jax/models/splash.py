"""Causal GQA attention through the Pallas splash-attention kernel (TPU), packed rows via segment ids.

On TPU this is the compiled kernel; on other backends the same kernel runs in Pallas interpret mode
(slow; for tests of the wiring only). The kernel works per batch row on [heads, T, head_dim]: each KV
head serves its group of query heads through the multi-query form, vmapped over batch and KV heads.
The softmax scale is applied to q (the kernel has none). Padding tokens (segment id 0) attend among
themselves and give finite values the caller masks, as the XLA path does.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=16)
def _kernel(t: int, group: int, block: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((t, t)) for _ in range(group)])
    b = min(block, t)
    sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                          block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
    return sa.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, segment_ids: jax.Array | None, block: int = 128) -> jax.Array:
    """q [B,T,N,H], k/v [B,T,K,H] -> [B,T,N,H] (q.dtype), causal within each segment id."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    kernel = _kernel(t, g, block, jax.default_backend() != "tpu")
    qh = (q * jnp.asarray(scale, q.dtype)).reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
    kh = k.transpose(0, 2, 1, 3)  # [B, K, T, H]
    vh = v.transpose(0, 2, 1, 3)
    seg = jnp.ones((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def one(qg, kk, vv, s):  # one row, one KV head: qg [G, T, H], kk/vv [T, H]
        return kernel(qg, kk, vv, segment_ids=sa.SegmentIds(q=s, kv=s))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))  # over KV heads
    out = jax.vmap(per_head, in_axes=(0, 0, 0, 0))(qh, kh, vh, seg)  # [B, K, G, T, H]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q.dtype)
