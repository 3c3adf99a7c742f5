"""ModelConfig: the architecture (Hugging Face config.json names) plus our run choices (RUN_FIELDS: dtypes,
remat, scanned layers, attention and delta-rule kernels)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from mpa_jax.models import registry

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("xla", "cudnn", "splash")
# Fields of `config.model` that are run settings: with `init_from`, they override the checkpoint's config.
RUN_FIELDS = ("param_dtype", "compute_dtype", "remat", "scan_layers", "attention_impl", "delta_impl")
# Keys of `config.model` that are run settings, not architecture.
_RUN_KEYS = ("init_from", "logprob_chunk")
# config.json keys we write ourselves or that carry no architecture; never copied into `extra`.
_HF_META_KEYS = ("architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "rope_scaling")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and numerics of a model. Field names follow HF config.json.

    `param_dtype` is the dtype parameters are stored in (master weights), `compute_dtype` the dtype
    matmuls run in; `remat` one of REMAT_POLICIES (per decoder layer). `extra` keeps config.json keys
    we do not interpret so that a round trip preserves them.
    """

    family: str = "qwen3"
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    checkpoint_dtype: str = "bfloat16"  # config.json `dtype`/`torch_dtype`: what save_pretrained writes by default
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "none"
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    # --- Qwen3.5 / Qwen3.5-MoE fields (Helper D adds optional fields below this line only) ---
    # Hybrid layers: "linear_attention" (Gated DeltaNet) or "full_attention"; None -> every
    # `full_attention_interval`-th layer is full attention. Validated in mpa_jax.models.qwen3_5.
    layer_types: tuple[str, ...] | None = None
    full_attention_interval: int = 4
    partial_rotary_factor: float = 1.0  # fraction of head_dim that RoPE rotates (Qwen3.5: 0.25)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    num_experts: int = 0  # Qwen3.5-MoE: routed experts per layer
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    router_aux_loss_coef: float = 0.001
    delta_impl: str = "jnp"  # gated delta rule: "jnp" (chunked) | "pallas"
    delta_chunk_size: int = 64
    hf_prefix: str = "model."  # "model.language_model." for the released multimodal checkpoints
    expert_layout: str = "per_expert"  # HF expert tensors: "per_expert" (experts.<e>.*, what transformers saves) | "fused" (gate_up_proj)

    # --- end of Qwen3.5 fields ---

    # --- scale settings (issue 17): how the decoder runs, not what it is; never written to config.json ---
    scan_layers: bool = False  # stacked layer params + one lax.scan over blocks (models/scan.py)
    attention_impl: str = "xla"  # xla | cudnn (GPU fused attention) | splash (TPU Pallas kernel); layers.attention

    def __post_init__(self) -> None:
        if self.family not in registry.FAMILIES:
            _fail(f"unknown model family {self.family!r} (known: {', '.join(sorted(registry.FAMILIES))})")
        for name in ("param_dtype", "compute_dtype", "checkpoint_dtype"):
            if getattr(self, name) not in DTYPES:
                _fail(f"{name}={getattr(self, name)!r} is not one of {DTYPES}")
        if self.remat not in REMAT_POLICIES:
            _fail(f"remat={self.remat!r} is not one of {REMAT_POLICIES}")
        if self.num_attention_heads % self.num_key_value_heads:
            _fail(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            _fail(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.attention_impl not in ATTENTION_IMPLS:
            _fail(f"attention_impl={self.attention_impl!r} is not one of {ATTENTION_IMPLS}")
        if self.hidden_act != "silu":
            _fail(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")

    def __hash__(self) -> int:
        # `extra` is a dict; hash its canonical JSON so configs can be static jit arguments.
        items = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "extra"]
        return hash((tuple(items), json.dumps(dict(self.extra), sort_keys=True, default=str)))

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def abstract_params(self) -> Any:
        """The parameter tree as ShapeDtypeStructs (jax.eval_shape of the family's init: nothing allocated).

        The one helper for the abstract build that sharding, memory planning, loading and export need.
        """
        import jax

        module = registry.family_module(self.family)
        return jax.eval_shape(lambda r: module.init_params(self, r), jax.random.key(0))

    def param_logical_axes(self) -> Any:
        """Logical axis names per parameter (same tree as `abstract_params`)."""
        return registry.family_module(self.family).param_logical_axes(self)

    @property
    def model_type(self) -> str:
        """HF model_type written to config.json by the default writer (the family name)."""
        return self.family

    # ---- Hugging Face config.json -------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> "ModelConfig":
        """Build from a config.json dict (family from `model_type`); `overrides` set our own fields."""
        if "model_type" not in hf:
            _fail("config.json has no model_type")
        family = registry.family_from_model_type(str(hf["model_type"]))
        module = registry.family_module(family)
        if hasattr(module, "config_from_hf"):
            fields = dict(module.config_from_hf(dict(hf)))
        else:
            fields = common_from_hf(hf)
        fields["family"] = family
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (loadable by transformers and SGLang)."""
        module = registry.family_module(self.family)
        if hasattr(module, "config_to_hf"):
            return dict(module.config_to_hf(self))
        return common_to_hf(self)


def _fail(message: str) -> None:
    raise ValueError(message)


_COMMON_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
    "attention_bias",
    "hidden_act",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def rope_theta_from_hf(hf: Mapping[str, Any]) -> float:
    """RoPE theta from `rope_parameters` (transformers 5) or the legacy top-level `rope_theta`.

    Only the default rope type is supported: scaled variants change positions and are refused.
    """
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        _fail(f"config.json rope_type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        _fail("config.json has no rope_theta (neither top-level nor in rope_parameters)")
    return float(theta)


def common_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig fields shared by the Qwen families, from a config.json dict."""
    if hf.get("use_sliding_window"):
        _fail("config.json use_sliding_window=true is not supported")
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in hf]
    if missing:
        _fail(f"config.json lacks {', '.join(missing)}")
    # None means "default" in HF configs, except for token ids where None is a real value.
    fields: dict[str, Any] = {
        k: hf[k] for k in _COMMON_FIELDS if k in hf and (hf[k] is not None or k.endswith("token_id"))
    }
    if isinstance(fields.get("eos_token_id"), list):
        fields["eos_token_id"] = tuple(fields["eos_token_id"])
    fields.setdefault("num_key_value_heads", hf["num_attention_heads"])
    if hf.get("head_dim") is None:
        fields["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    fields["rope_theta"] = rope_theta_from_hf(hf)
    dtype = hf.get("dtype", hf.get("torch_dtype")) or "bfloat16"
    if dtype not in DTYPES:
        _fail(f"config.json dtype {dtype!r} is not supported (one of {DTYPES})")
    fields["checkpoint_dtype"] = dtype
    known = set(_COMMON_FIELDS) | set(_HF_META_KEYS) | {"rope_theta", "rope_parameters", "head_dim"}
    fields["extra"] = {k: v for k, v in hf.items() if k not in known}
    return fields


def common_to_hf(cfg: ModelConfig, architecture: str = "Qwen3ForCausalLM") -> dict[str, Any]:
    """config.json dict for the Qwen3-style fields of `cfg`."""
    out: dict[str, Any] = dict(cfg.extra)
    out.update({k: getattr(cfg, k) for k in _COMMON_FIELDS})
    if isinstance(out["eos_token_id"], tuple):
        out["eos_token_id"] = list(out["eos_token_id"])
    out["architectures"] = [architecture]
    out["model_type"] = cfg.family
    # Both spellings: transformers 5 reads rope_parameters, older readers (SGLang, vLLM) rope_theta.
    out["rope_theta"] = cfg.rope_theta
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    out["dtype"] = cfg.checkpoint_dtype
    out["torch_dtype"] = cfg.checkpoint_dtype
    out.setdefault("use_sliding_window", False)
    return dict(sorted(out.items()))


def config_from_ml(model_cfg: Any, **overrides: Any) -> ModelConfig:
    """ModelConfig from the `config.model` section (ml_collections.ConfigDict or mapping).

    Run-setting keys (init_from, logprob_chunk) are skipped; any other unknown key is an error.
    """
    data = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if key in _RUN_KEYS:
            continue
        if key not in names:
            _fail(f"config.model.{key} is not a model config field")
        fields[key] = tuple(value) if isinstance(value, list) else value
    fields.update(overrides)
    return ModelConfig(**fields)


def run_model_config(config: Any) -> tuple[ModelConfig, str]:
    """The model config of an experiment config and the HF directory its weights come from ('' = random init).

    Without `config.model.init_from`: `config_from_ml(config.model)`. With it: the checkpoint's
    config.json gives the architecture, and `config.model`'s run settings (RUN_FIELDS: dtypes, remat,
    scan_layers, attention_impl, delta_impl) are applied on top.
    """
    import os

    section = config.model
    init_from = str(section.init_from or "")
    if not init_from:
        return config_from_ml(section), ""
    init_from = os.path.expanduser(init_from)
    path = os.path.join(init_from, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"config.model.init_from={init_from} has no config.json")
    with open(path, encoding="utf-8") as f:
        hf = json.load(f)
    overrides = {k: section.get(k) for k in RUN_FIELDS if section.get(k, None) is not None}
    return ModelConfig.from_hf(hf, **overrides), init_from
