"""Models: Qwen-family decoders in JAX with exact Hugging Face checkpoint layout.

Public API (every function dispatches on `cfg.family` to a family module; see registry.py)::

    from mpa_jax import models
    cfg = models.ModelConfig.from_hf(config_json_dict)   # or models.config_from_ml(config.model)
    cfg.to_hf() -> dict                                  # config.json
    params = models.init_params(cfg, rng, mesh=None, rules=None)
    logical = models.param_logical_axes(cfg)
    hidden = models.hidden_states(cfg, params, input_ids, positions=None, segment_ids=None, attention_mask=None)
    hidden, aux = models.hidden_states_with_aux(cfg, params, input_ids, ...)  # + MoE load-balancing loss
    logits = models.forward(cfg, params, input_ids, positions=None, segment_ids=None, attention_mask=None)
    w = models.unembedding(cfg, params)                  # [D, V]
    logp, entropy = models.token_logprobs(cfg, params, input_ids, targets, chunk_size=4096, temperature=1.0, ...)
    state = models.init_decode_state(cfg, batch, max_len, dtype=None)
    logits, state = models.decode(cfg, params, input_ids, positions, state, attention_mask=None)
    params = models.decode_params(cfg, params)           # once per jitted decode loop, before it
    state = models.init_slot_state(cfg, slots, max_len, dtype=None)          # slot rows (ring caches)
    logits, state = models.prefill_slots(cfg, params, state, ids, mask, rows, column, dtype=None)
    logits, state = models.decode_slots(cfg, params, tokens, positions, live, state, column)
    model = models.from_pretrained(path, dtype="float32", mesh=None, rules=None)
    logits = model(input_ids)
    models.save_pretrained(model, out_dir, tokenizer_dir=None, dtype=None)

Params are plain nested dicts (joining keys with "." gives the HF tensor name; `kernel` leaves are the
HF `weight` transposed to [in, out]). All functions are pure and jit-able with `cfg` static (closed
over or `static_argnums`; ModelConfig is hashable).

Inputs of `hidden_states` / `forward`: `input_ids` int32 [B, T]. `attention_mask` [B, T] (1 real, 0 pad;
left or right padding). `segment_ids` [B, T] int32 for packed sequences: a token attends only to
earlier tokens with the same segment id (padding may use its own id, e.g. 0, and also be masked out
with attention_mask). `positions` [B, T] int32; default: restart at 0 at each segment (packed), else
count of real tokens before the token (so with left padding the first real token is position 0), else
arange(T). `hidden_states` returns [B, T, D] after the final norm in compute dtype; `forward` returns
float32 logits [B, T, V]. Padding positions give finite values that callers must mask.

Incremental decoding (`decode`), for the sampler. The state holds a KV cache of `max_len` slots shared
by the batch, a bool `kv_mask` [B, max_len] (slot holds a real token) and `index` (int32 scalar: the
next slot to write). A call with T new tokens writes them at slots [index, index+T) and advances index
by T; token j of the call attends to cache slots <= index+j whose kv_mask is set (its own slot
included). `attention_mask` [B, T] (default all ones) marks which of the new tokens are real: pass the
left-padded prompt's mask for the prefill (T > 1), and for each step (T = 1) ones (or 0 for rows that
are finished, so their filler tokens are never attended). `positions` [B, T] are the RoPE positions,
which the caller tracks per row: for a left-padded prompt `cumsum(mask) - 1` (clipped at 0), then
`last + 1` for each step. The logits returned are float32 [B, T, V] for the T new tokens. Decoding
beyond max_len is not checked inside jit: keep index + T <= max_len.

Slot decoding (`decode_slots`), for the engine's continuous batching: every row of a *slot state* is
its own request at its own position, admitted and retired independently. Attention caches are rings of
`max_len` columns with one write column shared by every row: a step writes column `column` of every
row (a one-column in-place update, not a per-row scatter) and the caller advances it (mod max_len)
after each step. `prefill_slots` writes N left-padded prompts (ids/mask [N, P]) into rows `rows` [N]
(a row >= the slot count is dropped: filler) at the P columns just behind `column` (mod max_len),
replacing everything the row held (its other columns are cleared; recurrent states are replaced), and
returns each prompt's next-token logits [N, V]. `decode_slots` feeds one token per row, tokens and RoPE
positions [B] int32; `live` [B] bool marks the rows that hold a request: a live row's token goes in
`column` and is attended from then on, a row that is not live writes a masked column and keeps its
recurrent state (its logits are garbage). A row attends to its valid columns in whatever ring order
(keys carry their positions), so rows admitted at different times share the write column. The caller
keeps a row's columns from being overwritten: prompt bucket + new tokens <= max_len. Logits are float32
[B, V]. Each family implements `decode_slots` and declares its caches' ring axes (`slot_cache_axes`);
`init_slot_state` and `prefill_slots` are generic over them.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from mpa_jax.models import layers, registry
from mpa_jax.models.config import ModelConfig, config_from_ml, run_model_config
from mpa_jax.models.hf_io import Model, from_pretrained, save_pretrained

__all__ = [
    "ModelConfig",
    "Model",
    "config_from_ml",
    "run_model_config",
    "init_params",
    "param_logical_axes",
    "hidden_states",
    "hidden_states_with_aux",
    "forward",
    "unembedding",
    "init_decode_state",
    "decode",
    "decode_params",
    "init_slot_state",
    "prefill_slots",
    "decode_slots",
    "slot_cache_axes",
    "from_pretrained",
    "save_pretrained",
    "param_count",
    "token_logprobs",
]


def _family(cfg: ModelConfig):
    return registry.family_module(cfg.family)


def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """Tree of logical axis-name tuples, one per parameter (same structure as init_params)."""
    return _family(cfg).param_logical_axes(cfg)


def init_params(cfg: ModelConfig, rng: jax.Array, mesh: jax.sharding.Mesh | None = None, rules: Any = None):
    """Random parameters in cfg.param_dtype; with `mesh`, created directly sharded by `rules`.

    Sharded creation: shapes come from `jax.eval_shape`, and one jit with out_shardings creates each
    shard on its device (no full copy on any one device or on the host).
    """
    module = _family(cfg)
    fn = lambda r: module.init_params(cfg, r)  # noqa: E731
    if mesh is None:
        return jax.jit(fn)(rng)
    from mpa_jax import sharding

    shardings = sharding.param_shardings(cfg, mesh, rules)
    return jax.jit(fn, out_shardings=shardings)(rng)


def hidden_states(
    cfg: ModelConfig,
    params: Any,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Final hidden states [B, T, D] after the final norm (compute dtype)."""
    return _family(cfg).hidden_states(cfg, params, input_ids, positions, segment_ids, attention_mask)


def hidden_states_with_aux(
    cfg: ModelConfig,
    params: Any,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(hidden states [B, T, D], auxiliary loss) for training losses.

    The auxiliary loss is the MoE router's load-balancing loss times `router_aux_loss_coef` over the
    real tokens (attention_mask 1 and segment id not 0) when the model has routed experts and the
    coefficient is positive; a float32 0 otherwise. Add it to the mean token loss.
    """
    module = _family(cfg)
    if cfg.num_experts > 0 and cfg.router_aux_loss_coef > 0 and hasattr(module, "load_balancing_loss"):
        h, router_logits = module.forward_with_aux(cfg, params, input_ids, positions, segment_ids, attention_mask)
        real = jnp.ones(input_ids.shape, bool) if attention_mask is None else attention_mask.astype(bool)
        if segment_ids is not None:
            real = real & (segment_ids != 0)
        return h, module.load_balancing_loss(cfg, router_logits, real.astype(jnp.int32)).astype(jnp.float32)
    return hidden_states(cfg, params, input_ids, positions, segment_ids, attention_mask), jnp.zeros((), jnp.float32)


def unembedding(cfg: ModelConfig, params: Any) -> jax.Array:
    """Output projection [D, V] (tied: the embedding transposed)."""
    return _family(cfg).unembedding(cfg, params)


def forward(
    cfg: ModelConfig,
    params: Any,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, T, V] in float32 (matmul in compute dtype, float32 accumulation)."""
    h = hidden_states(cfg, params, input_ids, positions, segment_ids, attention_mask)
    w = unembedding(cfg, params).astype(h.dtype)
    lead = h.shape[:-1]
    logits = layers.matmul_f32(h.reshape(-1, h.shape[-1]), w)
    return logits.reshape(*lead, w.shape[-1])


def token_logprobs(
    cfg: ModelConfig,
    params: Any,
    input_ids: jax.Array,
    targets: jax.Array,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """float32 (log p(targets), entropy) [B, T] via chunked log-probs: no [B, T, V] float32 logits.

    `targets[b, t]` is the token whose probability is read at position t (usually input_ids shifted
    left by one); mask the results where targets are not real tokens.
    """
    from mpa_jax.kernels.logprobs import chunked_logprobs

    h = hidden_states(cfg, params, input_ids, positions, segment_ids, attention_mask)
    return chunked_logprobs(h, unembedding(cfg, params), targets, chunk_size=chunk_size, temperature=temperature)


def init_decode_state(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> Any:
    """Empty decoding state (KV cache etc.) for `batch` rows of up to `max_len` tokens."""
    return _family(cfg).init_decode_state(cfg, batch, max_len, dtype)


def decode_params(cfg: ModelConfig, params: Any) -> Any:
    """`params` prepared for a decode loop, inside the same jit, before the loop.

    With tied embeddings this adds the [D, V] output projection as `lm_head.kernel`, materialised once
    (an optimization barrier keeps XLA from folding the transpose back): a decode step then reads it
    in the orientation the logits dot runs fastest in, not the [V, D] table (on CPU ~2x the logits
    time, the largest op of a small model's step). A family may prepare more (`prepare_decode`:
    qwen3 concatenates each layer's q/k/v and gate/up kernels).
    """
    prepare = getattr(_family(cfg), "prepare_decode", None)
    if prepare is not None:
        params = prepare(cfg, params)
    if not cfg.tie_word_embeddings or "lm_head" in params:
        return params
    w = jax.lax.optimization_barrier(params["model"]["embed_tokens"]["weight"].T)
    return {**params, "lm_head": {"kernel": w}}


def decode(
    cfg: ModelConfig,
    params: Any,
    input_ids: jax.Array,
    positions: jax.Array,
    state: Any,
    attention_mask: jax.Array | None = None,
) -> tuple[jax.Array, Any]:
    """Feed T new tokens (prefill T > 1, step T = 1); returns float32 logits [B, T, V] and the new state."""
    return _family(cfg).decode(cfg, params, input_ids, positions, state, attention_mask)


def slot_cache_axes(cfg: ModelConfig) -> dict[str, Any]:
    """Per cache leaf of a slot state's `layers`, its ring axis (None: a per-row state without one)."""
    return _family(cfg).slot_cache_axes(cfg)


def init_slot_state(cfg: ModelConfig, slots: int, max_len: int, dtype: Any = None) -> dict[str, Any]:
    """Empty slot state for `slots` rows of up to `max_len` tokens: `{"layers", "kv_mask"}` as
    `init_decode_state` builds them (the ring's write column is the caller's, so no `index`)."""
    state = init_decode_state(cfg, slots, max_len, dtype)
    return {"layers": state["layers"], "kv_mask": state["kv_mask"]}


def prefill_slots(
    cfg: ModelConfig,
    params: Any,
    state: dict[str, Any],
    input_ids: jax.Array,
    attention_mask: jax.Array,
    rows: jax.Array,
    column: jax.Array,
    dtype: Any = None,
) -> tuple[jax.Array, dict[str, Any]]:
    """Write N left-padded prompts [N, P] into slot rows `rows` [N] (rows out of range are dropped),
    ending just behind ring column `column`; returns their next-token logits [N, V] float32 and the
    state (see the module docstring). `dtype`: the caches' dtype (as given to `init_slot_state`).

    Generic over the families: the prompts run through `decode` on a fresh P-column cache, then every
    cache leaf is placed in its rows by its `slot_cache_axes` (rolled into the ring columns, or copied
    whole when it has no ring axis).
    """
    n, p = input_ids.shape
    max_len = state["kv_mask"].shape[1]
    if p > max_len:
        raise ValueError(f"prefill_slots: prompts of {p} columns do not fit rings of {max_len}")
    mask = attention_mask.astype(jnp.int32)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
    fresh = init_decode_state(cfg, n, p, dtype)
    if p > 1:
        # All but the last column first: their logits are dead code, so XLA drops the unembedding there.
        _, fresh = decode(cfg, params, input_ids[:, :-1], positions[:, :-1], fresh, mask[:, :-1])
    logits, fresh = decode(cfg, params, input_ids[:, -1:], positions[:, -1:], fresh, mask[:, -1:])

    def place(big: jax.Array, new: jax.Array, axis: int | None) -> jax.Array:
        new = new.astype(big.dtype)
        if axis is not None:  # [N, ..., P at axis] -> ring columns [column - P, column) mod max_len, the rest cleared
            pad = [(0, 0)] * new.ndim
            pad[axis] = (max_len - p, 0)
            new = jnp.roll(jnp.pad(new, pad), column, axis=axis)
        return big.at[rows].set(new, mode="drop")

    axes = slot_cache_axes(cfg)
    new_layers = {name: {leaf: place(state["layers"][name][leaf], fresh["layers"][name][leaf], axis)
                         for leaf, axis in leaves.items()}
                  for name, leaves in axes.items()}
    return logits[:, 0], {"layers": new_layers, "kv_mask": place(state["kv_mask"], fresh["kv_mask"], 1)}


def decode_slots(
    cfg: ModelConfig,
    params: Any,
    tokens: jax.Array,
    positions: jax.Array,
    live: jax.Array,
    state: dict[str, Any],
    column: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
    """One token per slot row (tokens, positions [B] int32, live [B] bool) written at ring column
    `column`; returns float32 logits [B, V] and the new state (see the module docstring)."""
    return _family(cfg).decode_slots(cfg, params, tokens, positions, live, state, column)


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters, computed abstractly (nothing allocated)."""
    shapes = cfg.abstract_params()
    return sum(int(x.size) for x in jax.tree.leaves(shapes))
