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
    logits, state = models.extend_slots(cfg, params, state, ids, lengths, rows, starts)   # chunked prefill / continuation
    state = models.place_slots(cfg, state, src, dst, keep)                  # share, cut or empty rows
    logits, state = models.decode_slots(cfg, params, tokens, positions, live, state, columns)
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

Slot decoding, for the engine's continuous batching and prefix cache: every row of a *slot state*
(`init_slot_state`) is its own request, holding its tokens in columns [0, n) (a row's column is its
token's position), admitted, continued and retired independently. `extend_slots` writes a chunk of up to
C new tokens per row after what the row holds (a prompt, or the rest of one whose prefix the row already
holds: the next turn of an episode), attending to the held columns, and returns each row's next-token
logits; `place_slots` copies the first `keep` tokens of one row into another (a shared prompt prefix) or
cuts/empties a row. `decode_slots` feeds one token per row, tokens and positions [B] int32, written at
each row's column `columns` [B] (its position; a scalar column shared by every row also works); `live`
[B] bool marks the rows that hold a running request: a row that is not live keeps its columns and
recurrent state as they were (its logits are garbage), so a finished row's tokens stay reusable. A row
attends to its valid columns (`kv_mask`). Logits are float32 [B, V]. Each family implements
`decode_slots` and `decode(..., logits_at=)` and declares its caches' ring (sequence) axes
(`slot_cache_axes`); `init_slot_state`, `extend_slots` and `place_slots` are generic over them.
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
    "extend_slots",
    "place_slots",
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


def extend_slots(
    cfg: ModelConfig,
    params: Any,
    state: dict[str, Any],
    input_ids: jax.Array,
    lengths: jax.Array,
    rows: jax.Array,
    starts: jax.Array,
    dtype: Any = None,
    span: int | None = None,
) -> tuple[jax.Array, dict[str, Any]]:
    """Continue N slot rows by a chunk of new tokens each: row `rows[i]` (out of range: dropped) holds
    `starts[i]` tokens in columns [0, starts[i]); its `lengths[i]` new tokens `input_ids[i, :lengths[i]]`
    ([N, C], right-padded) go in the next columns, attending to what the row holds and causally to each
    other; recurrent states continue over them. Returns each row's next-token logits [N, V] float32
    (after its last new token) and the state. A fresh prompt is a continuation of an empty row
    (`place_slots` with keep 0 first); a long one is several chunks. Needs starts + C <= the columns
    (<= `span` when given: then only the first `span` columns of each row are read and written, so the
    chunk attends over what the rows hold, not over every column of a long slot).

    Generic over the families: each row is rolled so that its next column sits at a common index, the
    chunk runs through the family's `decode` (only the last real token is unembedded), and the row is
    rolled back (every leaf by its `slot_cache_axes`; per-row states are continued as they are).
    """
    n, c = input_ids.shape
    full = state["kv_mask"].shape[1]
    cols = full if span is None else min(int(span), full)
    if c > cols:
        raise ValueError(f"extend_slots: chunks of {c} columns do not fit rows of {cols}")
    index = cols - c
    shift = index - starts.astype(jnp.int32)  # roll row i by shift[i]: its column starts[i] -> index
    axes = slot_cache_axes(cfg)

    def roll(x: jax.Array, axis: int | None, by: jax.Array) -> jax.Array:
        if axis is None:
            return x
        return jax.vmap(lambda r, s: jnp.roll(r, s, axis=axis - 1))(x, by)

    def each(fn: Any, tree: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
        return {"layers": {name: {leaf: fn(tree["layers"][name][leaf], *(m["layers"][name][leaf] for m in more), axis)
                                  for leaf, axis in leaves.items()} for name, leaves in axes.items()},
                "kv_mask": fn(tree["kv_mask"], *(m["kv_mask"] for m in more), 1)}

    def window(x: jax.Array, axis: int | None) -> jax.Array:
        return x if axis is None or cols == full else jax.lax.slice_in_dim(x, 0, cols, axis=axis)

    safe = jnp.clip(rows, 0, state["kv_mask"].shape[0] - 1)
    mine = each(lambda x, a: roll(window(jnp.take(x, safe, axis=0), a), a, shift), state)
    valid = jnp.arange(c)[None, :] < lengths[:, None]
    positions = (starts[:, None] + jnp.arange(c)[None, :]).astype(jnp.int32)
    last = jnp.maximum(lengths - 1, 0).astype(jnp.int32)
    logits, out = _family(cfg).decode(cfg, params, input_ids, positions,
                                      {**mine, "index": jnp.asarray(index, jnp.int32)}, valid.astype(jnp.int32), logits_at=last)
    out = {"layers": out["layers"], "kv_mask": out["kv_mask"]}
    back = each(lambda x, a: roll(x, a, -shift), out)
    def put(big: jax.Array, x: jax.Array, axis: int | None) -> jax.Array:
        at = (rows,) if axis is None or cols == full else (rows,) + (slice(None),) * (axis - 1) + (slice(0, cols),)
        return big.at[at].set(x.astype(big.dtype), mode="drop")

    new = each(put, state, back)
    return logits[:, 0], new


def place_slots(
    cfg: ModelConfig,
    state: dict[str, Any],
    src: jax.Array,
    dst: jax.Array,
    keep: jax.Array,
    span: int | None = None,
) -> dict[str, Any]:
    """Row `dst[i]` (out of range: dropped) becomes row `src[i]`'s first `keep[i]` tokens: a cached prefix
    shared (src != dst), a row cut back to a prefix (src == dst) or emptied (keep 0: its recurrent
    states zeroed too). Per-row states without a ring axis are copied whole when keep > 0: the caller
    copies a recurrent row only at its end (its state is that of all it holds). All reads see the state
    before the call, so one call may both copy from a row and cut it. `span` (>= every keep): only the
    first `span` cache columns are copied (the mask is cut over all of them: what lies past is invalid)."""
    cols = state["kv_mask"].shape[1]
    safe = jnp.clip(src, 0, state["kv_mask"].shape[0] - 1)
    axes = slot_cache_axes(cfg)
    part = cols if span is None else min(int(span), cols)

    def one(big: jax.Array, axis: int | None, is_mask: bool = False) -> jax.Array:
        if axis is not None and not is_mask and part < cols:
            x = jax.lax.slice_in_dim(jnp.take(big, safe, axis=0), 0, part, axis=axis)
            return big.at[(dst,) + (slice(None),) * (axis - 1) + (slice(0, part),)].set(x, mode="drop")
        x = jnp.take(big, safe, axis=0)
        if is_mask:
            x = x & (jnp.arange(cols)[None, :] < keep[:, None])
        elif axis is None:
            x = jnp.where((keep > 0).reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros_like(x))
        return big.at[dst].set(x, mode="drop")

    layers_ = {name: {leaf: one(state["layers"][name][leaf], axis) for leaf, axis in leaves.items()}
               for name, leaves in axes.items()}
    return {"layers": layers_, "kv_mask": one(state["kv_mask"], 1, is_mask=True)}


def decode_slots(
    cfg: ModelConfig,
    params: Any,
    tokens: jax.Array,
    positions: jax.Array,
    live: jax.Array,
    state: dict[str, Any],
    columns: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
    """One token per slot row (tokens, positions [B] int32, live [B] bool) written at column `columns`
    ([B]: each row's own, or a scalar shared by all); returns float32 logits [B, V] and the new state
    (see the module docstring)."""
    return _family(cfg).decode_slots(cfg, params, tokens, positions, live, state, columns)


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters, computed abstractly (nothing allocated)."""
    shapes = cfg.abstract_params()
    return sum(int(x.size) for x in jax.tree.leaves(shapes))
