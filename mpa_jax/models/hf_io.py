"""Hugging Face checkpoints: read and write safetensors directories, generic over a family's hf_mapping.

Reading memory-maps each safetensors file and places every tensor straight into its target sharding
with `jax.make_array_from_callback` (each device reads only its slice; no full host copy of the
model). Writing streams one tensor at a time into shards of bounded size plus the index.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
from typing import Any, Callable, Iterator, Sequence

import ml_dtypes
import numpy as np

from mpa_jax.files import atomic_open
from mpa_jax.models import registry

# safetensors dtype name <-> numpy dtype, for the dtypes a checkpoint may hold our weights in.
_ST_TO_NP = {"F32": np.dtype(np.float32), "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16)}
_NAME_TO_ST = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """Param leaf at `path` <-> HF tensor(s): one name (transposed if `transpose`), or several stacked on axis 0."""

    path: tuple[str, ...]
    hf_names: tuple[str, ...]
    transpose: bool = False


class CheckpointError(ValueError):
    """A checkpoint this code cannot load; the message names the file or tensor."""


# ---- safetensors reading ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Entry:
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(path: str) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path} has a corrupt safetensors header") from None
    return header, 8 + n


class SafetensorsDir:
    """Lazy view of the tensors of a checkpoint directory (single file, or shards with an index)."""

    def __init__(self, path: str):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.isfile(os.path.join(path, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            raise CheckpointError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
        self.entries: dict[str, _Entry] = {}
        self._maps: dict[str, np.memmap] = {}
        for name in files:
            full = os.path.join(path, name)
            if not os.path.isfile(full):
                raise CheckpointError(f"{full} is named in the index but missing")
            header, base = _read_header(full)
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                self.entries[key] = _Entry(full, info["dtype"], tuple(info["shape"]), base + start, base + end)

    def array(self, name: str) -> np.ndarray:
        """Memory-mapped numpy view of tensor `name` (no read until sliced)."""
        e = self.entries[name]
        if e.dtype not in _ST_TO_NP:
            raise CheckpointError(f"tensor {name} has dtype {e.dtype}; supported: {', '.join(_ST_TO_NP)}")
        if e.file not in self._maps:
            self._maps[e.file] = np.memmap(e.file, dtype=np.uint8, mode="r")
        dt = _ST_TO_NP[e.dtype]
        count = int(np.prod(e.shape, dtype=np.int64))
        if e.end - e.start != count * dt.itemsize:
            raise CheckpointError(f"tensor {name} in {e.file}: byte size does not match shape {e.shape}")
        return self._maps[e.file][e.start : e.end].view(dt).reshape(e.shape)


# ---- loading ------------------------------------------------------------------------------------------
def _hf_shape(param_shape: tuple[int, ...], m: TensorMap) -> tuple[int, ...]:
    shape = param_shape[1:] if len(m.hf_names) > 1 else param_shape
    return tuple(reversed(shape)) if m.transpose else tuple(shape)


def _leaf_at(tree: Any, path: Sequence[str]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set_leaf(tree: dict, path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _ignored(module: Any, cfg: Any, name: str) -> bool:
    if hasattr(module, "hf_ignored"):
        return bool(module.hf_ignored(cfg, name))
    # Tied checkpoints sometimes still carry lm_head.weight (a copy of the embedding); rotary buffers too.
    return (cfg.tie_word_embeddings and name == "lm_head.weight") or name.endswith("rotary_emb.inv_freq")


def load_params(path: "str | SafetensorsDir", cfg: Any, mesh: Any = None, rules: Any = None) -> dict[str, Any]:
    """Parameters of `cfg` from the safetensors in `path`, placed into their shardings, cast to param_dtype."""
    import jax

    from mpa_jax.models import layers

    module = registry.family_module(cfg.family)
    store = path if isinstance(path, SafetensorsDir) else SafetensorsDir(path)
    abstract = cfg.abstract_params()
    if mesh is not None:
        from mpa_jax import sharding

        shardings = sharding.param_shardings(cfg, mesh, rules)
    else:
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: one, abstract)
    target = np.dtype(layers.dtype_of(cfg.param_dtype))
    maps = module.hf_mapping(cfg)
    used = {n for m in maps for n in m.hf_names}
    for name in sorted(store.entries):
        if name not in used and not _ignored(module, cfg, name):
            raise CheckpointError(f"checkpoint tensor {name} is not part of a {cfg.family} model with this config")
    params: dict[str, Any] = {}
    for m in maps:
        leaf = _leaf_at(abstract, m.path)
        want = _hf_shape(tuple(leaf.shape), m)
        arrays = []
        for name in m.hf_names:
            if name not in store.entries:
                raise CheckpointError(f"checkpoint lacks tensor {name}")
            got = store.entries[name].shape
            if got != want:
                raise CheckpointError(f"tensor {name} has shape {list(got)}, expected {list(want)}")
            arr = store.array(name)
            arrays.append(arr.T if m.transpose else arr)
        params_leaf = jax.make_array_from_callback(
            tuple(leaf.shape), _leaf_at(shardings, m.path), _slicer(arrays, len(m.hf_names) > 1, target)
        )
        _set_leaf(params, m.path, params_leaf)
    return params


def _slicer(arrays: list[np.ndarray], stacked: bool, dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    """Callback giving the slice `index` of the (stacked) parameter, read from the memory maps."""

    def get(index: tuple) -> np.ndarray:
        if not stacked:
            return np.ascontiguousarray(arrays[0][index]).astype(dtype)
        idx = index[0] if index else slice(None)
        rest = index[1:]
        picks = range(len(arrays))[idx]
        return np.stack([np.asarray(arrays[i][rest]).astype(dtype) for i in picks])

    return get


# ---- model object -------------------------------------------------------------------------------------
class Model:
    """A config and its parameters; calling it runs the jitted forward pass (float32 logits)."""

    def __init__(self, cfg: Any, params: Any):
        self.cfg = cfg
        self.params = params
        self._forward = None

    def __call__(self, input_ids: Any, **kwargs: Any) -> Any:
        """Logits [B, T, V] for int32 input_ids [B, T]; kwargs: positions, segment_ids, attention_mask."""
        import jax
        import jax.numpy as jnp

        from mpa_jax import models

        if self._forward is None:
            cfg = self.cfg
            self._forward = jax.jit(lambda p, ids, kw: models.forward(cfg, p, ids, **kw))
        kwargs = {k: jnp.asarray(v) for k, v in kwargs.items() if v is not None}
        return self._forward(self.params, jnp.asarray(input_ids, jnp.int32), kwargs)


def from_pretrained(
    path: str,
    dtype: str = "float32",
    mesh: Any = None,
    rules: Any = None,
    compute_dtype: str | None = None,
    remat: str = "none",
    scan_layers: bool = False,
) -> Model:
    """Load an HF checkpoint directory (config.json + safetensors) into a Model.

    `dtype`: parameter dtype ("float32" or "bfloat16"); `compute_dtype` defaults to it. With `mesh`,
    parameters are placed by `rules` (default: sharding.DEFAULT_RULES). Raises CheckpointError naming
    the tensor when an architecture, shape or dtype is not supported. `scan_layers` loads the layers
    stacked for the scanned decoder (`models/scan.py`); the checkpoint is the same either way.
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"{path} has no config.json")
    with open(config_path, encoding="utf-8") as f:
        hf = json.load(f)
    from mpa_jax.models.config import ModelConfig

    try:
        cfg = ModelConfig.from_hf(hf, param_dtype=dtype, compute_dtype=compute_dtype or dtype, remat=remat, scan_layers=scan_layers)
    except ValueError as e:
        raise CheckpointError(f"{config_path}: {e}") from None
    store = SafetensorsDir(path)
    module = registry.family_module(cfg.family)
    if hasattr(module, "hf_adapt_config"):
        cfg = module.hf_adapt_config(cfg, sorted(store.entries))
    return Model(cfg, load_params(store, cfg, mesh, rules))


# ---- saving -------------------------------------------------------------------------------------------
def _host_array(x: Any) -> np.ndarray:
    """The full value of one (possibly sharded) array on this host."""
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def params_to_hf(cfg: Any, params: Any, dtype: str) -> Iterator[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]]:
    """(HF name, shape, getter) for every tensor, in mapping order; getters materialise one tensor."""
    module = registry.family_module(cfg.family)
    np_dtype = _ST_TO_NP[_NAME_TO_ST[dtype]]
    for m in module.hf_mapping(cfg):
        leaf = _leaf_at(params, m.path)
        shape = _hf_shape(tuple(leaf.shape), m)
        for i, name in enumerate(m.hf_names):

            def get(leaf=leaf, i=i, m=m) -> np.ndarray:
                arr = _host_array(leaf[i] if len(m.hf_names) > 1 else leaf)
                arr = arr.T if m.transpose else arr
                return np.ascontiguousarray(arr.astype(np_dtype))

            yield name, shape, get


def _write_safetensors(path: str, tensors: list[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]], st_dtype: str) -> None:
    itemsize = _ST_TO_NP[st_dtype].itemsize
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with atomic_open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, get in tensors:
            arr = get()
            if tuple(arr.shape) != tuple(shape):
                raise RuntimeError(f"tensor {name}: shape {arr.shape} != planned {shape}")
            f.write(arr.tobytes())


def save_pretrained(
    model: Model,
    out_dir: str,
    tokenizer_dir: str | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = 2 * 1024**3,
) -> str:
    """Write `model` as an HF checkpoint: sharded safetensors + index, config.json, generation_config.json.

    `dtype` (default: the config's checkpoint_dtype) is the tensor dtype written; `tokenizer_dir`, when
    given, has its tokenizer files copied alongside. Only process 0 writes (all processes must call).
    Returns out_dir.
    """
    import jax

    cfg = model.cfg
    dtype = dtype or cfg.checkpoint_dtype
    if dtype not in _NAME_TO_ST:
        raise ValueError(f"save dtype {dtype!r} is not one of {', '.join(_NAME_TO_ST)}")
    if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
        raise ValueError(f"tokenizer_dir {tokenizer_dir} is not a directory")
    st_dtype = _NAME_TO_ST[dtype]
    itemsize = _ST_TO_NP[st_dtype].itemsize
    tensors = list(params_to_hf(cfg, model.params, dtype))
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = int(np.prod(t[1], dtype=np.int64)) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(out_dir, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for n, shard in enumerate(shards):
        fname = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        for name, shape, _ in shard:
            weight_map[name] = fname
            total += int(np.prod(shape, dtype=np.int64)) * itemsize
        if writer:
            _write_safetensors(os.path.join(out_dir, fname), shard, st_dtype)
        else:
            for _, _, get in shard:  # take part in the collective gathers
                get()
    if not writer:
        return out_dir
    _write_json(
        os.path.join(out_dir, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    hf = cfg.replace(checkpoint_dtype=dtype).to_hf()
    _write_json(os.path.join(out_dir, "config.json"), hf)
    module = registry.family_module(cfg.family)
    if hasattr(module, "generation_config"):
        gen = module.generation_config(cfg)
    else:
        gen = {k: getattr(cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(cfg, k) is not None}
        gen = {k: list(v) if isinstance(v, tuple) else v for k, v in gen.items()}
    _write_json(os.path.join(out_dir, "generation_config.json"), gen)
    if tokenizer_dir is not None:
        for fname in sorted(os.listdir(tokenizer_dir)):
            if fname in _TOKENIZER_FILES or fname.endswith((".jinja", ".tiktoken")):
                shutil.copyfile(os.path.join(tokenizer_dir, fname), os.path.join(out_dir, fname))
    return out_dir


def _write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
