"""The RL policy loss: token-level clipped importance ratio against the behaviour log-probs.

Per loss token t (weight w_t, advantage A_t of its rollout, behaviour log-prob b_t from the sampler):

    logp_t = log softmax(logits_t / T)[y_t]              (kernels.logprobs, vocabulary chunks)
    rho_t  = exp(logp_t - b_t)
    pg_t   = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t)
    kl_t   = exp(r_t - logp_t) - (r_t - logp_t) - 1      (k3 estimator; r_t = frozen reference log-prob)
    loss   = sum_t w_t (pg_t + kl_coef kl_t)  /  sum_t w_t

returned as (token sum, token count, extras) so that the train step's division by the total count
keeps it exact under packing and micro-batching (`train.step`). Extras (per-token sums, reported as
token means by the step): clip fraction, KL, entropy (at temperature T), ratio mean, |logp - b| gap,
and ratio max/min.

MoE models with `router_aux_loss_coef > 0`: the router's load-balancing loss (times the coefficient)
is added to the mean token loss, as the SFT loss does; metric `router_aux`.

`vocab_limit`: ids >= the tokenizer's size are never sampled (the engine gives them -inf logits), so
the learner's softmax leaves them out too (`chunked_logprobs(vocab_limit=)`), or every ratio would be
off by their probability mass.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from mpa_jax import models
from mpa_jax.kernels.logprobs import chunked_logprobs

# Per-token batch fields of an RL batch: ints, then floats.
INT_FIELDS = ("input_ids", "targets", "segment_ids", "positions")
FLOAT_FIELDS = ("loss_weights", "advantages", "behaviour_logprobs", "ref_logprobs")
FIELDS = INT_FIELDS + FLOAT_FIELDS


def policy_logprobs(cfg: models.ModelConfig, params: Any, batch: Mapping[str, jax.Array], *, temperature: float,
                    chunk: int, vocab_limit: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(log p(target), entropy) [B, T] of packed rows under `params` at `temperature`."""
    logp, ent, _ = policy_logprobs_with_aux(cfg, params, batch, temperature=temperature, chunk=chunk, vocab_limit=vocab_limit)
    return logp, ent


def policy_logprobs_with_aux(cfg: models.ModelConfig, params: Any, batch: Mapping[str, jax.Array], *, temperature: float,
                             chunk: int, vocab_limit: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log p(target), entropy, MoE router aux loss) of packed rows; the aux loss is
    `router_aux_loss_coef` x the router's load-balancing loss over the real tokens (`models.hidden_states_with_aux`),
    a float32 0 for dense models or a zero coefficient."""
    hidden, aux = models.hidden_states_with_aux(
        cfg, params, batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"],
        attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
    )
    unembed = models.unembedding(cfg, params)
    limit = vocab_limit if vocab_limit is not None and vocab_limit < unembed.shape[1] else None
    logp, ent = chunked_logprobs(hidden, unembed, batch["targets"], chunk_size=chunk, temperature=temperature, vocab_limit=limit)
    return logp, ent, aux


def token_losses(logp: jax.Array, batch: Mapping[str, jax.Array], *, clip_low: float, clip_high: float,
                 kl_coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token loss [B, T] and per-token metric values (unweighted) from learner log-probs."""
    adv = batch["advantages"].astype(jnp.float32)
    behaviour = batch["behaviour_logprobs"].astype(jnp.float32)
    diff = logp - behaviour
    ratio = jnp.exp(diff)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = -jnp.minimum(ratio * adv, clipped * adv)
    # A token is "clipped" when the clipped branch is the one taken (its gradient is zero).
    clip_hit = (clipped * adv < ratio * adv).astype(jnp.float32)
    loss = pg
    parts = {"clip_frac": clip_hit, "ratio": ratio, "logprob_gap": jnp.abs(diff)}
    if kl_coef > 0:
        d = batch["ref_logprobs"].astype(jnp.float32) - logp
        kl = jnp.exp(d) - d - 1.0
        loss = loss + kl_coef * kl
        parts["kl"] = kl
    return loss, {**parts, "_ratio_raw": ratio}


def make_rl_loss(cfg: models.ModelConfig, *, temperature: float, clip_low: float, clip_high: float, kl_coef: float = 0.0,
                 chunk: int = 1024, vocab_limit: int | None = None) -> Callable[[Any, Mapping[str, jax.Array]], tuple]:
    """`loss_fn(params, batch) -> (token-loss sum, weight sum, extras)` for packed RL batches."""
    if not temperature > 0:
        raise ValueError(f"RL loss needs a sampling temperature > 0 (ratios of greedy samples are undefined), got {temperature}")
    if not (0 <= clip_low < 1 and clip_high >= 0):
        raise ValueError(f"RL loss: clip_low={clip_low} must be in [0, 1) and clip_high={clip_high} >= 0")

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> tuple:
        logp, ent, aux = policy_logprobs_with_aux(cfg, params, batch, temperature=temperature, chunk=chunk, vocab_limit=vocab_limit)
        w = batch["loss_weights"].astype(jnp.float32)
        per_tok, parts = token_losses(logp, batch, clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef)
        ratio = parts.pop("_ratio_raw")
        on = w > 0
        extras = {k: jnp.sum(jax.lax.stop_gradient(v) * w) for k, v in parts.items()}
        extras["entropy"] = jnp.sum(jax.lax.stop_gradient(ent) * w)
        if "kl" not in extras:
            extras["kl"] = jnp.zeros((), jnp.float32)
        r = jax.lax.stop_gradient(ratio)
        extras["ratio_max"] = jnp.max(jnp.where(on, r, -jnp.inf))
        extras["ratio_min"] = jnp.min(jnp.where(on, r, jnp.inf))
        count = jnp.sum(w)
        # MoE: the router's load-balancing loss joins the policy loss as in SFT (`sft.loss`): added as
        # aux x token count, so that the step's sum / count is the mean token loss + aux (micro-batches:
        # aux weighted by each micro-batch's tokens). Reported as `router_aux` (a token mean: aux).
        extras["router_aux"] = jax.lax.stop_gradient(aux) * count
        return jnp.sum(per_tok * w) + aux * jax.lax.stop_gradient(count), count, extras

    return loss_fn
