"""The optimizer: AdamW with linear warm-up + cosine decay and global-norm clipping (optax).

Gradient accumulation is not an optax wrapper here: the train step sums gradients of *token sums*
over micro-batches and divides once by the total token count (see `train.step`), which is exact.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def lr_schedule(lr: float, warmup_steps: int, total_steps: int, end_ratio: float = 0.1) -> optax.Schedule:
    """Linear warm-up from 0 to `lr` over `warmup_steps`, then cosine decay to `lr * end_ratio` at `total_steps`."""
    if lr <= 0:
        raise ValueError(f"learning rate must be positive, got {lr}")
    if total_steps <= 0:
        raise ValueError(f"total steps must be positive, got {total_steps}")
    warmup_steps = max(0, min(int(warmup_steps), int(total_steps) - 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=lr,
        warmup_steps=warmup_steps,
        decay_steps=max(int(total_steps), warmup_steps + 1),
        end_value=lr * end_ratio,
    )


def _decay_mask(params: Any) -> Any:
    """Weight decay on matrices only: norms' scales and biases (ndim < 2) are not decayed."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(
    *,
    lr: float,
    warmup_steps: int,
    total_steps: int,
    weight_decay: float = 0.0,
    clip_norm: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    end_ratio: float = 0.1,
    kind: str = "adamw",
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW, or SGD with momentum `b1` (`kind="sgd"`), with decoupled weight decay on matrices (+ clipping
    when `clip_norm` > 0) and its schedule; the schedule is returned for logging.

    SGD is for fine-tuning a converged model on noisy gradients (RL): AdamW with fresh moments moves every
    parameter by about `lr` on its first steps whatever its gradient (m / sqrt(v) is +-1), i.e. sign
    noise over the whole model, while an SGD step follows the gradient's own size and direction."""
    schedule = lr_schedule(lr, warmup_steps, total_steps, end_ratio)
    parts = []
    if clip_norm and clip_norm > 0:
        parts.append(optax.clip_by_global_norm(clip_norm))
    if kind == "adamw":
        parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=_decay_mask))
    elif kind == "sgd":
        if weight_decay:
            parts.append(optax.masked(optax.add_decayed_weights(weight_decay), _decay_mask))
        parts.append(optax.sgd(schedule, momentum=b1 or None))
    else:
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {kind!r}")
    return optax.chain(*parts), schedule


def optimizer_from_config(sft: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Build the optimizer from a `config.sft`-like section (lr, warmup_steps, steps, weight_decay, ...)."""
    return make_optimizer(
        lr=float(sft.lr),
        warmup_steps=int(sft.warmup_steps),
        total_steps=int(sft.steps),
        weight_decay=float(sft.weight_decay),
        clip_norm=float(sft.clip_norm),
        b1=float(sft.b1),
        b2=float(sft.b2),
        end_ratio=float(sft.lr_end_ratio),
    )
