"""Orbax training checkpoint -> Hugging Face directory, one tensor at a time.

The exporter never restores the whole train state: it reads the checkpoint's array metadata (shapes,
dtypes), then `models.save_pretrained` pulls each tensor as it writes it, and each pull is an orbax
partial restore of that one parameter (tensorstore reads of its chunks). Peak host memory is one
parameter leaf (a stacked leaf of scanned layers or experts counts as one), not the model, whatever the
checkpoint's size or sharding. Optimizer state is never read.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from mpa_jax.train.checkpoint import CheckpointError, drop_abandoned_read_reports, find_step_dir


class _LazyTensor:
    """A parameter of a checkpoint, read from disk only when converted to an array.

    A stacked leaf (experts, scanned layers) is read once and sliced into its HF tensors; it is held
    until its last slice is written, so peak host memory is one such leaf."""

    def __init__(self, state_dir: str, path: tuple[str, ...], shape: tuple[int, ...], dtype: Any, index: int | None = None):
        self.state_dir = state_dir
        self.path = path
        self._shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.index = index
        self._cache: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape[1:] if self.index is not None else self._shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, i: int) -> "_LazyTensor":
        # Stacked leaves (e.g. experts) export as several HF tensors; share one read between them.
        sub = _LazyTensor(self.state_dir, self.path, self._shape, self.dtype, int(i))
        sub._parent = self  # type: ignore[attr-defined]
        return sub

    def _read_full(self) -> np.ndarray:
        if self._cache is None:
            self._cache = read_param(self.state_dir, self.path)
        return self._cache

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.index is not None:
            parent: _LazyTensor = self._parent  # type: ignore[attr-defined]
            arr = parent._read_full()[self.index]
            if self.index == self._shape[0] - 1:
                parent._cache = None  # last slice taken: drop the stacked tensor
        else:
            arr = read_param(self.state_dir, self.path)
        return arr.astype(dtype) if dtype is not None else arr


def read_param(state_dir: str, path: tuple[str, ...]) -> np.ndarray:
    """One parameter of a saved TrainState as a host array (orbax partial restore)."""
    import orbax.checkpoint as ocp

    item: dict[str, Any] = {}
    args: dict[str, Any] = {}
    node, anode = item.setdefault("params", {}), args.setdefault("params", {})
    for key in path[:-1]:
        node, anode = node.setdefault(key, {}), anode.setdefault(key, {})
    node[path[-1]] = 0
    anode[path[-1]] = ocp.RestoreArgs(restore_type=np.ndarray)
    drop_abandoned_read_reports()
    try:
        out = ocp.PyTreeCheckpointer().restore(
            state_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True)
        )
    except Exception as e:  # orbax raises many types; say which tensor of which checkpoint
        raise CheckpointError(f"checkpoint {state_dir}: cannot read params/{'/'.join(path)} ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    for key in ("params",) + tuple(path):
        out = out[key]
    return np.asarray(out)


def _read_meta(root: str, step: int) -> dict[str, Any]:
    import orbax.checkpoint as ocp

    meta_dir = os.path.join(root, str(step), "meta")
    if not os.path.isdir(meta_dir):
        raise CheckpointError(f"{root}/{step} is not an MPA-JAX training checkpoint (no meta item)")
    drop_abandoned_read_reports()
    try:
        return ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(meta_dir)
    except Exception as e:
        raise CheckpointError(f"{meta_dir} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def _lazy_params(state_dir: str) -> dict[str, Any]:
    """Nested dict of _LazyTensor over the params of a saved TrainState (from its metadata only)."""
    import orbax.checkpoint as ocp

    import logging

    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # orbax warns that the item dir lacks step metadata: expected here
    drop_abandoned_read_reports()
    try:
        meta = ocp.StandardCheckpointer().metadata(state_dir)
    except Exception as e:
        raise CheckpointError(f"checkpoint {state_dir}: metadata unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    finally:
        absl_logger.setLevel(level)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, dict) or "params" not in tree:
        raise CheckpointError(f"checkpoint {state_dir} holds no params")

    def build(node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: build(v, path + (k,)) for k, v in node.items()}
        return _LazyTensor(state_dir, path, tuple(node.shape), node.dtype)

    return build(tree["params"], ())


def export_checkpoint(
    checkpoint: str,
    out_dir: str,
    *,
    dtype: str = "bfloat16",
    tokenizer_dir: str | None = None,
    max_shard_bytes: int = 2 * 1024**3,
) -> str:
    """Write the HF directory for a run dir, its `checkpoints/` dir or one step dir (latest step when not given).

    `dtype`: "bfloat16" or "float32" tensors out. `tokenizer_dir`: tokenizer files copied alongside.
    The directory also gets its card, `mpa_checkpoint.json` (`mpa_jax.card.card_for_export`: the model,
    tokenizer, chat template, and the run's context format and recipe). Returns `out_dir`.
    """
    from mpa_jax import models

    if dtype not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"export dtype must be bfloat16, float16 or float32, got {dtype!r}")
    root, step = find_step_dir(checkpoint)
    meta = _read_meta(root, step)
    if "model" not in meta:
        raise CheckpointError(f"{root}/{step}: meta has no model config")
    cfg = models.ModelConfig.from_hf(meta["model"])
    params = _lazy_params(os.path.join(root, str(step), "state"))
    got = {"/".join(p): tuple(t.shape) for p, t in _flatten(params)}
    # A run with model.scan_layers saved its layers stacked; the HF checkpoint is the same either way.
    scanned = cfg.replace(scan_layers=True)
    if got != _expected_shapes(cfg) and got == _expected_shapes(scanned):
        cfg = scanned
    expected = _expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in got:
            raise CheckpointError(f"{root}/{step}: params/{name} missing for a {cfg.family} model with the saved config")
        if tuple(got[name]) != tuple(shape):
            raise CheckpointError(f"{root}/{step}: params/{name} has shape {tuple(got[name])}, the saved config needs {tuple(shape)}")
    out = models.save_pretrained(models.Model(cfg, params), out_dir, tokenizer_dir=tokenizer_dir, dtype=dtype, max_shard_bytes=max_shard_bytes)
    import jax

    if jax.process_index() == 0:
        from mpa_jax import card

        run_dir = os.path.dirname(root) if os.path.basename(root) == "checkpoints" else root
        card.write_json(os.path.join(out, card.CARD), card.card_for_export(run_dir, out, cfg.to_hf(), os.path.join(root, str(step))), default=str)
    return out


def _expected_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    shapes = cfg.abstract_params()
    return {"/".join(p): tuple(s.shape) for p, s in _flatten(shapes)}


def _flatten(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, dict):
        out = []
        for k, v in tree.items():
            out.extend(_flatten(v, path + (k,)))
        return out
    return [(path, tree)]
