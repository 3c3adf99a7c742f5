"""The SFT loss: masked next-token negative log-likelihood as (token sum, token count), plus the MoE
router's load-balancing loss when the model has one (`router_aux_loss_coef > 0`).

Log-probs of the targets come from `kernels.logprobs.chunked_logprobs` over vocabulary chunks, so no
[B, T, V] float32 logits are ever materialised.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from mpa_jax import models, sharding
from mpa_jax.kernels.logprobs import chunked_logprobs, vocab_parallel_logprobs


def make_sft_loss(
    cfg: models.ModelConfig, chunk: int = 1024, mesh: Any = None, rules: Any = None
) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]:
    """`loss_fn(params, batch) -> (sum of -log p(target) over weighted tokens, weight sum)` for packed batches.

    With `mesh` (and `rules`): activations carry their logical-axis sharding constraints, and when the
    `vocab` rule shards the vocabulary, log-probs come from `vocab_parallel_logprobs` (no device holds
    the full [D, V] unembedding or [B, T, V] logits).
    """
    vocab_axes = sharding.mesh_axes_for("vocab", mesh, rules) if mesh is not None else ()
    batch_axes = sharding.mesh_axes_for("batch", mesh, rules) if mesh is not None else ()

    def logprobs(hidden: jax.Array, unembed: jax.Array, targets: jax.Array) -> jax.Array:
        if vocab_axes and unembed.shape[1] % math.prod(mesh.shape[a] for a in vocab_axes) == 0:
            return vocab_parallel_logprobs(hidden, unembed, targets, mesh, vocab_axes, batch_axes, chunk_size=chunk)[0]
        return chunked_logprobs(hidden, unembed, targets, chunk_size=chunk)[0]

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        with sharding.activation_sharding(mesh, rules):
            return _loss(params, batch)

    def _loss(params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        # MoE: the router's load-balancing loss (x router_aux_loss_coef; 0 for dense models) joins the
        # loss. It is added as aux * weight sum, so that the step's sum / count is the mean token loss
        # plus aux (micro-batches: aux weighted by each micro-batch's tokens).
        hidden, aux = models.hidden_states_with_aux(
            cfg, params, batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"],
            attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
        )
        unembed = models.unembedding(cfg, params)
        logp = logprobs(hidden, unembed, batch["targets"])
        w = batch["loss_weights"].astype(jnp.float32)
        count = jnp.sum(w)
        return -jnp.sum(logp.astype(jnp.float32) * w) + aux * jax.lax.stop_gradient(count), count

    return loss_fn
