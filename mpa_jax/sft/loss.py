"""The SFT loss: masked next-token negative log-likelihood as (token sum, token count).

Log-probs of the targets come from `kernels.logprobs.chunked_logprobs` over vocabulary chunks, so no
[B, T, V] float32 logits are ever materialised.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from mpa_jax import models
from mpa_jax.kernels.logprobs import chunked_logprobs


def make_sft_loss(cfg: models.ModelConfig, chunk: int = 1024) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]:
    """`loss_fn(params, batch) -> (sum of -log p(target) over weighted tokens, weight sum)` for packed batches."""

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        hidden = models.hidden_states(
            cfg, params, batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"],
            attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
        )
        unembed = models.unembedding(cfg, params)
        logp, _ = chunked_logprobs(hidden, unembed, batch["targets"], chunk_size=chunk)
        w = batch["loss_weights"].astype(jnp.float32)
        return -jnp.sum(logp.astype(jnp.float32) * w), jnp.sum(w)

    return loss_fn
