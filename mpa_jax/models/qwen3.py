"""Qwen3 dense decoder (family "qwen3"): the family-module functions listed in registry.py.

Parameter tree (plain nested dicts; joining the keys with "." gives the HF tensor name, with
`kernel` = the HF `weight` transposed to [in, out]):

    model.embed_tokens.weight                 [V, D]
    model.layers.<i>.input_layernorm.weight   [D]
    model.layers.<i>.self_attn.{q,k,v}_proj.kernel  [D, heads*head_dim]   (+ .bias when attention_bias)
    model.layers.<i>.self_attn.o_proj.kernel  [heads*head_dim, D]
    model.layers.<i>.self_attn.{q,k}_norm.weight    [head_dim]
    model.layers.<i>.post_attention_layernorm.weight [D]
    model.layers.<i>.mlp.{gate,up}_proj.kernel [D, I];  mlp.down_proj.kernel [I, D]
    model.norm.weight                         [D]
    lm_head.kernel                            [D, V]   (only when embeddings are not tied)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from mpa_jax import sharding
from mpa_jax.models import layers, scan, specs
from mpa_jax.models.config import ModelConfig
from mpa_jax.models.hf_io import TensorMap

Params = dict[str, Any]


# ---- parameters ---------------------------------------------------------------------------------------
def _shapes(cfg: ModelConfig) -> dict[str, Any]:
    """Tree of (shape, logical axes, init kind) per parameter."""
    d, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd

    def lin(n_in: int, n_out: int, axes: tuple[str, str]) -> dict[str, Any]:
        return {"kernel": ((n_in, n_out), axes, "normal")}

    def attn_lin(n_in: int, n_out: int, axes: tuple[str, str]) -> dict[str, Any]:
        out = lin(n_in, n_out, axes)
        if cfg.attention_bias:
            out["bias"] = ((n_out,), axes[1:], "zeros")
        return out

    def norm(n: int, axis: str = "norm") -> dict[str, Any]:
        return {"weight": ((n,), (axis,), "ones")}

    layer = {
        "input_layernorm": norm(d),
        "self_attn": {
            "q_proj": attn_lin(d, nq, ("embed", "heads")),
            "k_proj": attn_lin(d, nkv, ("embed", "kv_heads")),
            "v_proj": attn_lin(d, nkv, ("embed", "kv_heads")),
            "o_proj": attn_lin(nq, d, ("heads", "embed")),
            "q_norm": norm(hd, "head_dim"),
            "k_norm": norm(hd, "head_dim"),
        },
        "post_attention_layernorm": norm(d),
        "mlp": {
            "gate_proj": lin(d, i, ("embed", "mlp")),
            "up_proj": lin(d, i, ("embed", "mlp")),
            "down_proj": lin(i, d, ("mlp", "embed")),
        },
    }
    if cfg.scan_layers:  # one stacked layer tree [L, ...]: the decoder is one lax.scan (scan.py)
        return specs.decoder_tree(cfg, scan.stack_specs([layer] * cfg.num_hidden_layers, 1), norm(d))
    return specs.decoder_tree(cfg, {str(n): layer for n in range(cfg.num_hidden_layers)}, norm(d))


def param_logical_axes(cfg: ModelConfig) -> Params:
    """Logical axis names per parameter (same tree as init_params)."""
    return specs.logical_axes(_shapes(cfg))


def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
    """Random parameters: normal(initializer_range) matrices, unit norms, zero biases."""
    leaves, treedef = jax.tree.flatten(_shapes(cfg), is_leaf=specs.is_spec)
    dtype = layers.dtype_of(cfg.param_dtype)
    out = []
    for n, (shape, _, kind) in enumerate(leaves):
        if kind == "normal":
            # fold_in by leaf index: values do not depend on how many other leaves exist before sharding.
            key = jax.random.fold_in(rng, n)
            out.append((cfg.initializer_range * jax.random.normal(key, shape, jnp.float32)).astype(dtype))
        elif kind == "ones":
            out.append(jnp.ones(shape, dtype))
        else:
            out.append(jnp.zeros(shape, dtype))
    return jax.tree.unflatten(treedef, out)


def unembedding(cfg: ModelConfig, params: Params) -> jax.Array:
    """[D, V] output projection (the embedding transposed when tied)."""
    if cfg.tie_word_embeddings:
        w = params["model"]["embed_tokens"]["weight"].T
        if jax.default_backend() == "cpu":
            # Materialise the [D, V] copy: otherwise XLA:CPU folds the transpose into the logits dot and
            # its gradient becomes dlogits^T h contracting over tokens on both sides, a slow GEMM form
            # there (~2x the h^T dlogits form). The copy is small next to the [T, V] logits.
            w = jax.lax.optimization_barrier(w)
        return w
    return params["lm_head"]["kernel"]


def decode_unembedding(cfg: ModelConfig, params: Params) -> jax.Array:
    """[D, V] output projection for decode: `lm_head.kernel` when present (untied, or added by
    `mpa_jax.models.decode_params`), else the tied embedding transposed and read in place."""
    if "lm_head" in params:
        return params["lm_head"]["kernel"]
    return params["model"]["embed_tokens"]["weight"].T


def hf_mapping(cfg: ModelConfig) -> list[TensorMap]:
    """Param path <-> HF tensor name for every parameter."""
    maps = []
    for path, _ in jax.tree_util.tree_flatten_with_path(_shapes(cfg), is_leaf=specs.is_spec)[0]:
        keys = tuple(k.key for k in path)
        transpose = keys[-1] == "kernel"
        per_layer = scan.expand_layer_keys(keys, 1, cfg.num_hidden_layers) if cfg.scan_layers else [keys]
        names = tuple(".".join(k[:-1] + ("weight" if transpose else k[-1],)) for k in per_layer)
        maps.append(TensorMap(keys, names, transpose))
    return maps


def layer_params(cfg: ModelConfig, params: Params) -> dict[str, Params]:
    """{str(n): layer n's params}, whether the layers are stacked (scan_layers) or not."""
    stacked = params["model"]["layers"]
    return scan.unstack(stacked, 1) if cfg.scan_layers else stacked


# ---- forward ------------------------------------------------------------------------------------------
def _qkv(cfg: ModelConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """Projected, normed and rotated q [B,T,N,H] and k, v [B,T,K,H]."""
    b, t, _ = x.shape
    hd = cfg.head_dim

    def proj(name: str, heads: int) -> jax.Array:
        y = layers.dense(x, p[name]["kernel"])
        if "bias" in p[name]:
            y = y + p[name]["bias"].astype(y.dtype)
        return y.reshape(b, t, heads, hd)

    q = layers.rms_norm(proj("q_proj", cfg.num_attention_heads), p["q_norm"]["weight"], cfg.rms_norm_eps)
    k = layers.rms_norm(proj("k_proj", cfg.num_key_value_heads), p["k_norm"]["weight"], cfg.rms_norm_eps)
    v = sharding.constrain(proj("v_proj", cfg.num_key_value_heads), layers.KV_AXES)
    q = sharding.constrain(layers.apply_rope(q, cos, sin), layers.Q_AXES)
    return q, sharding.constrain(layers.apply_rope(k, cos, sin), layers.KV_AXES), v


_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")


def _concat(p: Params, names: tuple[str, ...]) -> Params:
    """{"kernel": the kernels of `names` side by side on the output axis (and "bias" when they have one)};
    the last axis, so a stacked [blocks, D, out] tree (scan_layers) works as well."""
    out = {"kernel": jnp.concatenate([p[n]["kernel"] for n in names], axis=-1)}
    if "bias" in p[names[0]]:
        out["bias"] = jnp.concatenate([p[n]["bias"] for n in names], axis=-1)
    return out


def prepare_decode(cfg: ModelConfig, params: Params) -> Params:
    """`params` with each layer's q/k/v kernels as one `qkv_proj` and gate/up as one `gate_up_proj`
    (the separate ones dropped): what `_qkv_fused` / `_mlp_fused` read. Used by
    `mpa_jax.models.decode_params`; materialised once per weight version where that runs in its own
    program (the slot loop)."""
    layers_ = params["model"]["layers"]

    def fuse(p: Params) -> Params:
        attn = {k: v for k, v in p["self_attn"].items() if k not in _QKV}
        mlp = {k: v for k, v in p["mlp"].items() if k not in _GATE_UP}
        return {**p, "self_attn": {**attn, "qkv_proj": _concat(p["self_attn"], _QKV)},
                "mlp": {**mlp, "gate_up_proj": _concat(p["mlp"], _GATE_UP)}}

    # Unstacked {str(n): layer} or stacked {str(j): layer tree [blocks, ...]}: kernels end in their output axis either way.
    return {**params, "model": {**params["model"], "layers": {n: fuse(p) for n, p in layers_.items()}}}


def _qkv_fused(cfg: ModelConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """As `_qkv`, with q/k/v as one matmul over the concatenated kernels (decode: fewer tiny dots).

    The kernels come concatenated from `prepare_decode`; otherwise they are concatenated here (loop
    invariant: XLA hoists it out of a decode loop, but a program that runs a few steps per call,
    like the slot loop's chunk, would copy every kernel per call).
    """
    b, t, _ = x.shape
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    fused = p["qkv_proj"] if "qkv_proj" in p else _concat(p, _QKV)  # prefused by `prepare_decode`
    y = layers.dense(x, fused["kernel"])
    if "bias" in fused:
        y = y + fused["bias"].astype(y.dtype)
    q, k, v = jnp.split(y, [nq * hd, (nq + nkv) * hd], axis=-1)
    q = layers.rms_norm(q.reshape(b, t, nq, hd), p["q_norm"]["weight"], cfg.rms_norm_eps)
    k = layers.rms_norm(k.reshape(b, t, nkv, hd), p["k_norm"]["weight"], cfg.rms_norm_eps)
    return layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin), v.reshape(b, t, nkv, hd)


def _mlp_fused(cfg: ModelConfig, p: Params, x: jax.Array) -> jax.Array:
    """As `_mlp`, with gate and up as one matmul (decode)."""
    h = layers.rms_norm(x, p["post_attention_layernorm"]["weight"], cfg.rms_norm_eps)
    m = p["mlp"]
    gate_up = m["gate_up_proj"] if "gate_up_proj" in m else _concat(m, _GATE_UP)
    gate, up = jnp.split(layers.dense(h, gate_up["kernel"]), 2, axis=-1)
    return x + layers.dense(jax.nn.silu(gate) * up, m["down_proj"]["kernel"])


def _out(p: Params, attn: jax.Array) -> jax.Array:
    b, t = attn.shape[:2]
    y = layers.dense(attn.reshape(b, t, -1), p["o_proj"]["kernel"])
    if "bias" in p["o_proj"]:
        y = y + p["o_proj"]["bias"].astype(y.dtype)
    return y


def _mlp(cfg: ModelConfig, p: Params, x: jax.Array) -> jax.Array:
    h = layers.rms_norm(x, p["post_attention_layernorm"]["weight"], cfg.rms_norm_eps)
    m = p["mlp"]
    return x + layers.swiglu(h, m["gate_proj"]["kernel"], m["up_proj"]["kernel"], m["down_proj"]["kernel"])


def _embed(cfg: ModelConfig, params: Params, input_ids: jax.Array) -> jax.Array:
    table = params["model"]["embed_tokens"]["weight"]
    return jnp.take(table, input_ids, axis=0).astype(layers.dtype_of(cfg.compute_dtype))


def hidden_states(
    cfg: ModelConfig,
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Final-norm hidden states [B, T, D] (compute dtype); see registry.py for argument semantics."""
    b, t = input_ids.shape
    if positions is None:
        positions = layers.default_positions(b, t, segment_ids, attention_mask)
    cos, sin = layers.rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    mask = layers.self_attention_mask(segment_ids, attention_mask, t)
    scale = cfg.head_dim**-0.5

    def layer_fn(p: Params, x: jax.Array) -> jax.Array:
        h = layers.rms_norm(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        q, k, v = _qkv(cfg, p["self_attn"], h, cos, sin)
        x = x + _out(p["self_attn"], layers.causal_attention(q, k, v, mask, scale, impl=cfg.attention_impl, segment_ids=segment_ids))
        return sharding.constrain(_mlp(cfg, p, x), layers.EMBED_AXES)

    layer_fn = layers.remat_wrap(layer_fn, cfg.remat)
    x = sharding.constrain(_embed(cfg, params, input_ids), layers.EMBED_AXES)
    if cfg.scan_layers:
        x, _ = scan.run(params["model"]["layers"], x, [lambda p, h: (layer_fn(p, h), None)])
        return layers.rms_norm(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)
    for n in range(cfg.num_hidden_layers):
        x = layer_fn(params["model"]["layers"][str(n)], x)
    return layers.rms_norm(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)


# ---- incremental decoding -----------------------------------------------------------------------------
def init_decode_state(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> dict[str, Any]:
    """Empty KV cache: per-layer keys k [B, K, head_dim, max_len] and values v [B, K, max_len, head_dim],
    kv_mask [B, max_len], index (next slot).

    Head-major, with the keys transposed, so that the attention dots read the cache as it is
    (`layers.cached_attention`): no per-step transpose of the whole cache, and both dots in the form
    XLA:CPU runs fastest.
    """
    dtype = layers.dtype_of(cfg.compute_dtype) if dtype is None else jnp.dtype(dtype)
    k_shape = (batch, cfg.num_key_value_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
    return {
        "layers": {
            str(n): {"k": jnp.zeros(k_shape, dtype), "v": jnp.zeros(v_shape, dtype)}
            for n in range(cfg.num_hidden_layers)
        },
        "kv_mask": jnp.zeros((batch, max_len), bool),
        "index": jnp.zeros((), jnp.int32),
    }


def decode_mask(state: dict[str, Any], attention_mask: jax.Array | None, t: int) -> tuple[jax.Array, jax.Array]:
    """Updated kv_mask [B, S] and the attention mask [B, 1, T, S] for T new tokens at slot `index`.

    Shared with other families: a new token at slot index+j sees cache slots <= index+j that hold
    real tokens.
    """
    kv_mask = state["kv_mask"]
    b, s = kv_mask.shape
    idx = state["index"]
    new = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
    kv_mask = jax.lax.dynamic_update_slice(kv_mask, new, (0, idx))
    q_slot = idx + jnp.arange(t)
    causal = jnp.arange(s)[None, :] <= q_slot[:, None]
    return kv_mask, causal[None, None] & kv_mask[:, None, None, :]


def _cached_layers(cfg: ModelConfig, params: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
                   caches: dict[str, Any], column: jax.Array, mask: jax.Array, live: jax.Array | None = None,
                   logits_at: jax.Array | None = None) -> tuple[jax.Array, dict[str, Any]]:
    """The decoder over cached keys/values, shared by `decode` (linear cache) and `decode_slots` (slot rows):
    the T new tokens' keys/values go in cache columns [column, column + T) of every row (`column`: a
    scalar, or [B] per row; rows not `live` keep their columns), then each attends to the columns
    `mask` [B, 1, T, S] allows. Returns the logits [B, T, V] float32 (only at token `logits_at` [B] of
    each row, [B, 1, V], when given) and the caches."""
    scale = cfg.head_dim**-0.5
    new_layers = {}
    all_layers = layer_params(cfg, params)
    for n in range(cfg.num_hidden_layers):
        p = all_layers[str(n)]
        cache = caches[str(n)]
        h = layers.rms_norm(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        q, k, v = _qkv_fused(cfg, p["self_attn"], h, cos, sin)
        # New keys/values go in head-major (k [B, K, H, T], v [B, K, T, H]: transposes of T rows only).
        k_new = k.transpose(0, 2, 3, 1).astype(cache["k"].dtype)
        v_new = v.transpose(0, 2, 1, 3).astype(cache["v"].dtype)
        ck = layers.write_columns(cache["k"], k_new, column, 3, live)
        cv = layers.write_columns(cache["v"], v_new, column, 2, live)
        new_layers[str(n)] = {"k": ck, "v": cv}
        attn = layers.cached_attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask, scale)
        x = _mlp_fused(cfg, p, x + _out(p["self_attn"], attn))
    if logits_at is not None:  # one token per row: the unembedding of the others is never computed
        x = jnp.take_along_axis(x, logits_at[:, None, None].astype(jnp.int32), axis=1)
    x = layers.rms_norm(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)
    w = decode_unembedding(cfg, params).astype(x.dtype)
    return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32), new_layers


def decode(
    cfg: ModelConfig,
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array,
    state: dict[str, Any],
    attention_mask: jax.Array | None = None,
    logits_at: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, Any]]:
    """Run T new tokens through the model against the cache; see mpa_jax.models for semantics."""
    t = input_ids.shape[1]
    idx = state["index"]
    kv_mask, mask = decode_mask(state, attention_mask, t)
    cos, sin = layers.rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    logits, new_layers = _cached_layers(cfg, params, _embed(cfg, params, input_ids), cos, sin, state["layers"], idx, mask,
                                        logits_at=logits_at)
    return logits, {"layers": new_layers, "kv_mask": kv_mask, "index": idx + t}


def slot_cache_axes(cfg: ModelConfig) -> dict[str, Any]:
    """The ring (sequence) axis of every cache leaf of a slot state: k [B, K, H, S] -> 3, v [B, K, S, H] -> 2."""
    return {str(n): {"k": 3, "v": 2} for n in range(cfg.num_hidden_layers)}


def decode_slots(
    cfg: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    live: jax.Array,
    state: dict[str, Any],
    column: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
    """One token per slot row at its own column; semantics in mpa_jax.models (`decode_slots`)."""
    kv_mask = layers.write_columns(state["kv_mask"], live[:, None], column, 1, live)
    # No causal term: a row's valid columns are its own tokens (keys carry their positions).
    mask = kv_mask[:, None, None, :]
    cos, sin = layers.rope_tables(positions[:, None], cfg.head_dim, cfg.rope_theta)
    logits, new_layers = _cached_layers(cfg, params, _embed(cfg, params, tokens[:, None]), cos, sin, state["layers"], column, mask,
                                        live)
    return logits[:, 0], {"layers": new_layers, "kv_mask": kv_mask}
