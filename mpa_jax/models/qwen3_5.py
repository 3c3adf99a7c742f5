"""Qwen3.5 hybrid decoder (family "qwen3_5"; Qwen3.5-MoE reuses it): the registry.py family functions.

Layers follow `layer_types` (default: every `full_attention_interval`-th layer is full attention,
the rest Gated DeltaNet, see deltanet.py). Full attention is gated: q_proj yields per head the query
and an output gate ([q | gate] per head), q/k RMSNorm per head, RoPE on the first
`partial_rotary_factor * head_dim` dims, attention output * sigmoid(gate). All RMSNorms except the
DeltaNet output norm are zero-centred: x_normed * (1 + weight), computed in float32. The MLP is a
SwiGLU (dense family) or the MoE block (qwen3_5_moe, moe.py).

Parameter tree (joined keys = HF tensor names of `Qwen3_5ForCausalLM`; `kernel` = HF weight^T):

    model.embed_tokens.weight, model.norm.weight, lm_head.kernel (untied)
    model.layers.<i>.{input_layernorm,post_attention_layernorm}.weight
    model.layers.<i>.self_attn.{q,k,v,o}_proj.kernel, self_attn.{q,k}_norm.weight      (full attention)
    model.layers.<i>.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj}.kernel,
        linear_attn.conv1d.weight [C,1,K], linear_attn.{dt_bias,A_log}, linear_attn.norm.weight   (DeltaNet)
    model.layers.<i>.mlp.{gate,up,down}_proj.kernel                                      (dense)

Released multimodal checkpoints (`Qwen3_5ForConditionalGeneration`, config.json with `text_config`)
keep the text model under `model.language_model.`: `cfg.hf_prefix` says which, and their vision tower
(`model.visual.*`) and multi-token-prediction head (`mtp.*`) are ignored with a log line.
"""
from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp

from mpa_jax import sharding
from mpa_jax.models import deltanet, layers, moe, scan, specs
from mpa_jax.models.config import ModelConfig, common_from_hf, common_to_hf
from mpa_jax.models.hf_io import TensorMap
from mpa_jax.models.qwen3 import decode_mask, decode_unembedding, unembedding  # shared by the families

Params = dict[str, Any]
log = logging.getLogger(__name__)

LINEAR, FULL = "linear_attention", "full_attention"
_PREFIXES = ("model.", "model.language_model.")
# config.json keys (text config) that become ModelConfig fields here.
_HF_FIELDS = (
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "router_aux_loss_coef",
)


# ---- configuration ------------------------------------------------------------------------------------
def layer_types(cfg: ModelConfig) -> tuple[str, ...]:
    """The type of every layer: cfg.layer_types, or every full_attention_interval-th layer full."""
    if cfg.layer_types is not None:
        return tuple(cfg.layer_types)
    return tuple(
        FULL if (i + 1) % cfg.full_attention_interval == 0 else LINEAR for i in range(cfg.num_hidden_layers)
    )


def rotary_dim(cfg: ModelConfig) -> int:
    """Number of head dims RoPE rotates."""
    return int(cfg.head_dim * cfg.partial_rotary_factor)


def is_moe(cfg: ModelConfig) -> bool:
    return cfg.family == "qwen3_5_moe"


def check(cfg: ModelConfig) -> None:
    """Raise ValueError naming the first Qwen3.5 field that does not fit."""
    types = layer_types(cfg)
    if len(types) != cfg.num_hidden_layers:
        raise ValueError(f"layer_types has {len(types)} entries for num_hidden_layers={cfg.num_hidden_layers}")
    bad = sorted({t for t in types if t not in (LINEAR, FULL)})
    if bad:
        raise ValueError(f"layer_types contains {bad}; supported: {LINEAR!r}, {FULL!r}")
    if cfg.full_attention_interval < 1:
        raise ValueError(f"full_attention_interval={cfg.full_attention_interval} must be >= 1")
    rd = rotary_dim(cfg)
    if rd < 2 or rd % 2 or rd > cfg.head_dim:
        raise ValueError(f"partial_rotary_factor={cfg.partial_rotary_factor} gives rotary dim {rd}; need even, 2..head_dim")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ValueError(
            f"linear_num_value_heads={cfg.linear_num_value_heads} is not a multiple of "
            f"linear_num_key_heads={cfg.linear_num_key_heads}"
        )
    if cfg.linear_conv_kernel_dim < 1:
        raise ValueError(f"linear_conv_kernel_dim={cfg.linear_conv_kernel_dim} must be >= 1")
    if cfg.delta_impl not in ("jnp", "pallas"):
        raise ValueError(f"delta_impl={cfg.delta_impl!r} is not one of 'jnp', 'pallas'")
    if cfg.delta_chunk_size < 1:
        raise ValueError(f"delta_chunk_size={cfg.delta_chunk_size} must be positive")
    if cfg.hf_prefix not in _PREFIXES:
        raise ValueError(f"hf_prefix={cfg.hf_prefix!r} is not one of {_PREFIXES}")
    if is_moe(cfg):
        if cfg.num_experts < 1 or not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
            raise ValueError(
                f"MoE needs 1 <= num_experts_per_tok ({cfg.num_experts_per_tok}) <= num_experts ({cfg.num_experts})"
            )
        if cfg.moe_intermediate_size < 1 or cfg.shared_expert_intermediate_size < 1:
            raise ValueError("MoE needs positive moe_intermediate_size and shared_expert_intermediate_size")
        if cfg.expert_layout not in ("fused", "per_expert"):
            raise ValueError(f"expert_layout={cfg.expert_layout!r} is not one of 'fused', 'per_expert'")


def config_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields from a Qwen3.5 / Qwen3.5-MoE config.json (text-only or multimodal)."""
    multimodal = isinstance(hf.get("text_config"), dict)
    text = dict(hf["text_config"]) if multimodal else dict(hf)
    if multimodal:
        for key in ("dtype", "torch_dtype", "tie_word_embeddings"):
            if key in hf and key not in text:
                text[key] = hf[key]
    fields = common_from_hf(text)
    extra = dict(fields.pop("extra"))
    for key in _HF_FIELDS:
        if key in extra:
            fields[key] = extra.pop(key)
    types = extra.pop("layer_types", None)
    if types is not None:
        fields["layer_types"] = tuple(types)
    if "full_attention_interval" in extra:
        fields["full_attention_interval"] = int(extra.pop("full_attention_interval"))
    rope = dict(text.get("rope_parameters") or {})
    fields["partial_rotary_factor"] = float(rope.get("partial_rotary_factor", extra.pop("partial_rotary_factor", 0.25)))
    extra.pop("partial_rotary_factor", None)
    # Keep the rest of rope_parameters (mrope_section, mrope_interleaved) so that saving writes it back.
    extra["rope_parameters"] = rope
    extra.pop("model_type", None)
    if multimodal:
        extra["multimodal"] = {k: v for k, v in hf.items() if k != "text_config"}
        fields["hf_prefix"] = "model.language_model."
    fields["extra"] = extra
    return fields


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for transformers/SGLang: text-only, or multimodal when loaded from a multimodal one."""
    check(cfg)
    moe_family = is_moe(cfg)
    arch = "Qwen3_5MoeForCausalLM" if moe_family else "Qwen3_5ForCausalLM"
    text = common_to_hf(cfg, arch)
    multimodal = text.pop("multimodal", None)
    text.pop("use_sliding_window", None)
    text["model_type"] = "qwen3_5_moe_text" if moe_family else "qwen3_5_text"
    text["layer_types"] = list(layer_types(cfg))
    text["full_attention_interval"] = cfg.full_attention_interval
    for key in _HF_FIELDS:
        if moe_family or not key.startswith(("num_experts", "moe_", "shared_expert", "router_")):
            text[key] = getattr(cfg, key)
    rope = dict(cfg.extra.get("rope_parameters") or {})
    rope.update({"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor})
    text["rope_parameters"] = rope
    text["partial_rotary_factor"] = cfg.partial_rotary_factor
    if cfg.hf_prefix == "model.language_model.":
        out = dict(multimodal or {})
        out["text_config"] = dict(sorted(text.items()))
        out["model_type"] = "qwen3_5_moe" if moe_family else "qwen3_5"
        out["architectures"] = ["Qwen3_5MoeForConditionalGeneration" if moe_family else "Qwen3_5ForConditionalGeneration"]
        out["tie_word_embeddings"] = cfg.tie_word_embeddings
        out["dtype"] = cfg.checkpoint_dtype
        return dict(sorted(out.items()))
    return dict(sorted(text.items()))


# ---- parameters ---------------------------------------------------------------------------------------
def _shapes(cfg: ModelConfig) -> Params:
    """Tree of (shape, logical axes, init kind) per parameter."""
    check(cfg)
    d, hd = cfg.hidden_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd

    def lin(n_in: int, n_out: int, axes: tuple[str, str]) -> Params:
        out: Params = {"kernel": ((n_in, n_out), axes, "normal")}
        if cfg.attention_bias:
            out["bias"] = ((n_out,), axes[1:], "zeros")
        return out

    def norm(n: int, axis: str = "norm") -> Params:
        return {"weight": ((n,), (axis,), "zeros")}  # zero-centred: the scale is 1 + weight

    attn = {
        "q_proj": lin(d, 2 * nq, ("embed", "heads")),
        "k_proj": lin(d, nkv, ("embed", "kv_heads")),
        "v_proj": lin(d, nkv, ("embed", "kv_heads")),
        "o_proj": lin(nq, d, ("heads", "embed")),
        "q_norm": norm(hd, "head_dim"),
        "k_norm": norm(hd, "head_dim"),
    }
    if is_moe(cfg):
        mlp = moe.shapes(cfg)
    else:
        i = cfg.intermediate_size
        mlp = {
            "gate_proj": {"kernel": ((d, i), ("embed", "mlp"), "normal")},
            "up_proj": {"kernel": ((d, i), ("embed", "mlp"), "normal")},
            "down_proj": {"kernel": ((i, d), ("mlp", "embed"), "normal")},
        }
    per_layer = []
    for kind in layer_types(cfg):
        layer = {"input_layernorm": norm(d), "post_attention_layernorm": norm(d), "mlp": mlp}
        if kind == FULL:
            layer["self_attn"] = attn
        else:
            layer["linear_attn"] = deltanet.shapes(cfg)
        per_layer.append(layer)
    if cfg.scan_layers:  # the 3:1 DeltaNet/attention pattern as one scanned block (scan.py)
        return specs.decoder_tree(cfg, scan.stack_specs(per_layer, scan_period(cfg)), norm(d))
    return specs.decoder_tree(cfg, {str(n): layer for n, layer in enumerate(per_layer)}, norm(d))


def scan_period(cfg: ModelConfig) -> int:
    """Layers per scanned block: the period of the layer-type pattern (4 for the released models)."""
    return scan.block_period(layer_types(cfg))


def layer_params(cfg: ModelConfig, params: Params) -> dict[str, Params]:
    """{str(n): layer n's params}, whether the layers are stacked (scan_layers) or not."""
    stacked = params["model"]["layers"]
    return scan.unstack(stacked, scan_period(cfg)) if cfg.scan_layers else stacked


def param_logical_axes(cfg: ModelConfig) -> Params:
    """Logical axis names per parameter (same tree as init_params)."""
    return specs.logical_axes(_shapes(cfg))


def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
    """Random parameters as transformers initialises them (normal matrices, zero-centred norms at 0,
    gated-norm weights and dt_bias at 1, A_log = log U(0.01, 16))."""
    leaves, treedef = jax.tree.flatten(_shapes(cfg), is_leaf=specs.is_spec)
    dtype = layers.dtype_of(cfg.param_dtype)
    out = []
    for n, (shape, _, kind) in enumerate(leaves):
        key = jax.random.fold_in(rng, n)
        if kind == "normal":
            out.append((cfg.initializer_range * jax.random.normal(key, shape, jnp.float32)).astype(dtype))
        elif kind == "a_log":
            out.append(jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)).astype(dtype))
        elif kind == "ones":
            out.append(jnp.ones(shape, dtype))
        else:
            out.append(jnp.zeros(shape, dtype))
    return jax.tree.unflatten(treedef, out)


def _expert_names(prefix: str, num_experts: int, proj: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{e}.{proj}.weight" for e in range(num_experts))


def hf_mapping(cfg: ModelConfig) -> list[TensorMap]:
    """Param path <-> HF tensor name(s) for every parameter."""
    maps = []
    for path, _ in jax.tree_util.tree_flatten_with_path(_shapes(cfg), is_leaf=specs.is_spec)[0]:
        keys = tuple(k.key for k in path)
        transpose = keys[-1] == "kernel"
        if cfg.scan_layers:
            period = scan_period(cfg)
            per_layer = scan.expand_layer_keys(keys, period, cfg.num_hidden_layers // period)
        else:
            per_layer = [keys]
        names = []
        for k in per_layer:
            parts = k[:-1] + ("weight" if transpose else k[-1],)
            names.append(cfg.hf_prefix + ".".join(parts[1:]) if parts[0] == "model" else ".".join(parts))
        if "experts" in keys[:-1] and cfg.expert_layout == "per_expert":
            if cfg.scan_layers:
                raise ValueError("scan_layers needs MoE experts in the fused layout (expert_layout='fused')")
            # Per-expert checkpoints: experts.<e>.<proj>.weight stacked on a new leading axis.
            base = names[0][: -len(f".{keys[-1]}")]
            maps.append(TensorMap(keys, _expert_names(base, cfg.num_experts, keys[-1]), False))
        else:
            maps.append(TensorMap(keys, tuple(names), transpose))
    return maps


_IGNORED = (
    (("model.visual.", "visual."), "vision tower (model.visual.*)"),
    (("mtp.", "model.mtp."), "multi-token prediction (mtp.*)"),
)


def hf_ignored(cfg: ModelConfig, name: str) -> bool:
    """Tensors present in released checkpoints that the text model does not load."""
    if any(name.startswith(prefixes) for prefixes, _ in _IGNORED):
        return True
    if cfg.tie_word_embeddings and name == "lm_head.weight":
        return True
    return name.endswith("rotary_emb.inv_freq")


def hf_adapt_config(cfg: ModelConfig, names: Any) -> ModelConfig:
    """The config matching a checkpoint's tensor names (MoE expert layout: fused or per-expert).

    Also logs, once per checkpoint, the vision and MTP tensors that loading will ignore.
    """
    names = list(names)
    for prefixes, what in _IGNORED:
        count = sum(n.startswith(prefixes) for n in names)
        if count:
            log.info("ignoring %d %s tensors of the checkpoint: the text model does not use them", count, what)
    if is_moe(cfg) and any(".mlp.experts.0.down_proj.weight" in n for n in names):
        return cfg.replace(expert_layout="per_expert")
    if is_moe(cfg) and any(n.endswith(".mlp.experts.down_proj") for n in names):
        return cfg.replace(expert_layout="fused")
    return cfg


def generation_config(cfg: ModelConfig) -> dict[str, Any]:
    """generation_config.json: the token ids the config knows."""
    gen = {k: getattr(cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(cfg, k) is not None}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in gen.items()}


# ---- forward ------------------------------------------------------------------------------------------
def rms_norm_1p(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Zero-centred RMSNorm: norm(x) * (1 + weight), all in float32, result in x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def _rope(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    return layers.rope_tables(positions, rotary_dim(cfg), cfg.rope_theta)


def _apply_partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return layers.apply_rope(x, cos, sin)
    return jnp.concatenate([layers.apply_rope(x[..., :rd], cos, sin), x[..., rd:]], axis=-1)


def _attn_inputs(cfg: ModelConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """q [B,T,N,H], k/v [B,T,K,H] (normed, rotated) and the output gate [B,T,N*H]."""
    b, t, _ = x.shape
    hd = cfg.head_dim

    def proj(name: str) -> jax.Array:
        y = layers.dense(x, p[name]["kernel"])
        if "bias" in p[name]:
            y = y + p[name]["bias"].astype(y.dtype)
        return y

    qg = proj("q_proj").reshape(b, t, cfg.num_attention_heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(b, t, -1)
    k = proj("k_proj").reshape(b, t, cfg.num_key_value_heads, hd)
    v = proj("v_proj").reshape(b, t, cfg.num_key_value_heads, hd)
    q = rms_norm_1p(q, p["q_norm"]["weight"], cfg.rms_norm_eps)
    k = rms_norm_1p(k, p["k_norm"]["weight"], cfg.rms_norm_eps)
    return _apply_partial_rope(q, cos, sin), _apply_partial_rope(k, cos, sin), v, gate


def _attn_out(p: Params, attn: jax.Array, gate: jax.Array) -> jax.Array:
    b, t = attn.shape[:2]
    y = attn.reshape(b, t, -1) * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(attn.dtype)
    y = layers.dense(y, p["o_proj"]["kernel"])
    if "bias" in p["o_proj"]:
        y = y + p["o_proj"]["bias"].astype(y.dtype)
    return y


def _mlp(cfg: ModelConfig, p: Params, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """Residual MLP sub-block; returns (x + mlp(norm(x)), router logits or None)."""
    h = rms_norm_1p(x, p["post_attention_layernorm"]["weight"], cfg.rms_norm_eps)
    m = p["mlp"]
    if is_moe(cfg):
        y, logits = moe.block(cfg, m, h)
        return x + y, logits
    return x + layers.swiglu(h, m["gate_proj"]["kernel"], m["up_proj"]["kernel"], m["down_proj"]["kernel"]), None


def _embed(cfg: ModelConfig, params: Params, input_ids: jax.Array) -> jax.Array:
    table = params["model"]["embed_tokens"]["weight"]
    return jnp.take(table, input_ids, axis=0).astype(layers.dtype_of(cfg.compute_dtype))


def _valid(segment_ids: jax.Array | None, attention_mask: jax.Array | None) -> jax.Array | None:
    """Real-token mask [B, T] (padding: attention_mask 0 or segment id 0), or None when all are real."""
    valid = None if attention_mask is None else attention_mask.astype(bool)
    if segment_ids is not None:
        seg_valid = segment_ids != 0
        valid = seg_valid if valid is None else valid & seg_valid
    return valid


def forward_with_aux(
    cfg: ModelConfig,
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Final-norm hidden states [B, T, D] and, for MoE, router logits [L, B*T, E] (else None)."""
    check(cfg)
    b, t = input_ids.shape
    if positions is None:
        positions = layers.default_positions(b, t, segment_ids, attention_mask)
    cos, sin = _rope(cfg, positions)
    mask = layers.self_attention_mask(segment_ids, attention_mask, t)
    valid = _valid(segment_ids, attention_mask)
    scale = cfg.head_dim**-0.5

    def full_layer(p: Params, x: jax.Array):
        h = rms_norm_1p(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        q, k, v, gate = _attn_inputs(cfg, p["self_attn"], h, cos, sin)
        q, k, v = (sharding.constrain(a, ax) for a, ax in ((q, layers.Q_AXES), (k, layers.KV_AXES), (v, layers.KV_AXES)))
        attn = layers.causal_attention(q, k, v, mask, scale, impl=cfg.attention_impl, segment_ids=segment_ids) \
            if cfg.attention_impl != "xla" else layers.attention(q, k, v, mask, scale)
        x = x + _attn_out(p["self_attn"], attn, gate)
        x, logits = _mlp(cfg, p, x)
        return sharding.constrain(x, layers.EMBED_AXES), logits

    def linear_layer(p: Params, x: jax.Array):
        h = rms_norm_1p(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        x = x + deltanet.forward(cfg, p["linear_attn"], h, valid, segment_ids)
        x, logits = _mlp(cfg, p, x)
        return sharding.constrain(x, layers.EMBED_AXES), logits

    fns = {FULL: layers.remat_wrap(full_layer, cfg.remat), LINEAR: layers.remat_wrap(linear_layer, cfg.remat)}
    x = sharding.constrain(_embed(cfg, params, input_ids), layers.EMBED_AXES)
    if cfg.scan_layers:
        block = [fns[kind] for kind in layer_types(cfg)[: scan_period(cfg)]]
        x, router_logits = scan.run(params["model"]["layers"], x, block)
        return rms_norm_1p(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps), router_logits
    router = []
    for n, kind in enumerate(layer_types(cfg)):
        x, logits = fns[kind](params["model"]["layers"][str(n)], x)
        if logits is not None:
            router.append(logits)
    x = rms_norm_1p(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)
    return x, (jnp.stack(router) if router else None)


def hidden_states(
    cfg: ModelConfig,
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Final-norm hidden states [B, T, D] (compute dtype); see registry.py for argument semantics."""
    return forward_with_aux(cfg, params, input_ids, positions, segment_ids, attention_mask)[0]


# ---- incremental decoding -----------------------------------------------------------------------------
def init_decode_state(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> dict[str, Any]:
    """Empty decode state: KV cache [B, max_len, K, H] for attention layers, conv inputs [B, K-1, C]
    and float32 recurrent state [B, Hv, Dk, Dv] for DeltaNet layers, kv_mask [B, max_len], index."""
    check(cfg)
    dtype = layers.dtype_of(cfg.compute_dtype) if dtype is None else jnp.dtype(dtype)
    shape = (batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
    caches = {}
    for n, kind in enumerate(layer_types(cfg)):
        if kind == FULL:
            caches[str(n)] = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
        else:
            caches[str(n)] = deltanet.init_cache(cfg, batch, dtype)
    return {"layers": caches, "kv_mask": jnp.zeros((batch, max_len), bool), "index": jnp.zeros((), jnp.int32)}


def _cached_layers(cfg: ModelConfig, params: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
                   caches: dict[str, Any], column: jax.Array, mask: jax.Array, valid: jax.Array,
                   live: jax.Array | None = None, logits_at: jax.Array | None = None):
    """The decoder over decode caches, shared by `decode` (linear cache) and `decode_slots` (rings):
    attention layers write the T new keys/values at columns [column, column + T) and attend as `mask`
    [B, 1, T, S] allows; DeltaNet layers continue each row's conv and recurrent state over the new
    tokens that are `valid` [B, T] (others leave it as it was). Returns logits [B, T, V] float32 and
    the caches."""
    scale = cfg.head_dim**-0.5
    new_layers = {}
    all_layers = layer_params(cfg, params)
    for n, kind in enumerate(layer_types(cfg)):
        p = all_layers[str(n)]
        cache = caches[str(n)]
        h = rms_norm_1p(x, p["input_layernorm"]["weight"], cfg.rms_norm_eps)
        if kind == FULL:
            q, k, v, gate = _attn_inputs(cfg, p["self_attn"], h, cos, sin)
            ck = layers.write_columns(cache["k"], k, column, 1, live)
            cv = layers.write_columns(cache["v"], v, column, 1, live)
            new_layers[str(n)] = {"k": ck, "v": cv}
            attn = layers.attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask, scale)
            x = x + _attn_out(p["self_attn"], attn, gate)
        else:
            y, new_layers[str(n)] = deltanet.decode(cfg, p["linear_attn"], h, valid, cache)
            x = x + y
        x, _ = _mlp(cfg, p, x)
    if logits_at is not None:  # one token per row: the unembedding of the others is never computed
        x = jnp.take_along_axis(x, logits_at[:, None, None].astype(jnp.int32), axis=1)
    x = rms_norm_1p(x, params["model"]["norm"]["weight"], cfg.rms_norm_eps)
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
    """Run T new tokens against the decode state; semantics as documented in mpa_jax.models."""
    check(cfg)
    b, t = input_ids.shape
    idx = state["index"]
    kv_mask, mask = decode_mask(state, attention_mask, t)
    valid = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
    cos, sin = _rope(cfg, positions)
    logits, new_layers = _cached_layers(cfg, params, _embed(cfg, params, input_ids), cos, sin, state["layers"], idx, mask, valid,
                                        logits_at=logits_at)
    return logits, {"layers": new_layers, "kv_mask": kv_mask, "index": idx + t}


def slot_cache_axes(cfg: ModelConfig) -> dict[str, Any]:
    """The ring axis of every cache leaf of a slot state: attention k/v [B, S, K, H] -> 1; DeltaNet's
    conv inputs and recurrent state have none (None: one state per row, replaced on admission)."""
    return {str(n): ({"k": 1, "v": 1} if kind == FULL else {"conv": None, "recurrent": None})
            for n, kind in enumerate(layer_types(cfg))}


def decode_slots(
    cfg: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    live: jax.Array,
    state: dict[str, Any],
    column: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
    """One token per slot row against ring attention caches and per-row DeltaNet states; semantics in
    mpa_jax.models (`decode_slots`). A row that is not live keeps its DeltaNet state."""
    check(cfg)
    kv_mask = layers.write_columns(state["kv_mask"], live[:, None], column, 1, live)
    mask = kv_mask[:, None, None, :]  # a row's valid columns are its own tokens: no causal term
    cos, sin = _rope(cfg, positions[:, None])
    logits, new_layers = _cached_layers(cfg, params, _embed(cfg, params, tokens[:, None]), cos, sin, state["layers"], column,
                                        mask, live[:, None], live)
    return logits[:, 0], {"layers": new_layers, "kv_mask": kv_mask}


# ---- abstract size report -----------------------------------------------------------------------------
def param_report(cfg: ModelConfig, mesh: Any = None, rules: Any = None) -> dict[str, Any]:
    """Parameter counts and memory from an abstract build (jax.eval_shape: nothing is allocated).

    Returns total params, active params per token (MoE: only num_experts_per_tok of num_experts routed
    experts count), bytes in param_dtype, and with `mesh` the largest per-device parameter bytes under
    `rules` (default sharding rules).
    """
    shapes = cfg.abstract_params()
    leaves = jax.tree_util.tree_flatten_with_path(shapes)[0]
    total = sum(int(x.size) for _, x in leaves)
    routed = sum(int(x.size) for path, x in leaves if "experts" in [getattr(k, "key", None) for k in path])
    active = total - routed
    if is_moe(cfg) and routed:
        active += routed * cfg.num_experts_per_tok // cfg.num_experts
    report: dict[str, Any] = {
        "total_params": total,
        "active_params": active,
        "param_bytes": sum(int(x.size) * x.dtype.itemsize for _, x in leaves),
    }
    if mesh is not None:
        from mpa_jax import sharding

        per_device = sharding.per_device_bytes(shapes, sharding.param_shardings(cfg, mesh, rules))
        report["mesh"] = sharding.describe(mesh)
        report["max_param_bytes_per_device"] = max(per_device.values())
    return report
