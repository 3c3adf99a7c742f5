"""Meshes and logical-axis sharding (MaxText vocabulary).

Mesh axes are (data, fsdp, tensor, expert). Arrays name their dimensions with logical axes (batch,
length, embed, mlp, heads, kv_heads, head_dim, vocab, experts, norm, ...); `rules` map each logical
name to a mesh axis, a tuple of mesh axes, or None (replicated). A logical name without a rule is
replicated. Rules come from `config.sharding_rules`.

Inside a traced step, `activation_sharding(mesh, rules)` makes `constrain(x, logical_axes)` pin
activations to their logical axes (a no-op outside it). This module never imports `mpa_jax.models`:
`param_shardings` takes the config's own `abstract_params()` and `param_logical_axes()`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mpa_jax.logical_axes import DEFAULT_RULES, MESH_AXES  # noqa: F401 (re-exported)

Rules = Sequence[tuple[str, Any]]


def mesh_shape(mesh_cfg: Any, num_devices: int | None = None) -> tuple[int, ...]:
    """Sizes of (data, fsdp, tensor, expert) from a config section; one `-1` takes the remaining devices."""
    n = jax.device_count() if num_devices is None else num_devices
    get = (lambda k: mesh_cfg[k]) if isinstance(mesh_cfg, Mapping) or hasattr(mesh_cfg, "keys") else (
        lambda k: getattr(mesh_cfg, k)
    )
    sizes = []
    for axis in MESH_AXES:
        try:
            sizes.append(int(get(axis)))
        except (KeyError, AttributeError):
            raise ValueError(f"mesh config lacks axis {axis!r}") from None
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh config {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh config {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n % known:
            raise ValueError(f"mesh config {dict(zip(MESH_AXES, sizes))} does not divide {n} devices")
        sizes[sizes.index(-1)] = n // known
    if math.prod(sizes) != n:
        raise ValueError(f"mesh config {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {n}")
    return tuple(sizes)


def make_mesh(mesh_cfg: Any, devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh over (data, fsdp, tensor, expert) from `config.mesh` (mapping or ConfigDict, or a 4-tuple)."""
    devices = list(jax.devices() if devices is None else devices)
    if isinstance(mesh_cfg, (tuple, list)):
        mesh_cfg = dict(zip(MESH_AXES, mesh_cfg))
    shape = mesh_shape(mesh_cfg, len(devices))
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 - topology-aware layout is best effort (e.g. CPU device subsets)
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def make_learner_mesh(mesh_cfg: Any) -> Mesh:
    """`make_mesh` over all devices, except that a mesh with no -1 axis and fewer devices than there are
    takes the first devices it needs (e.g. one learner device out of 8 forced host devices on CPU)."""
    sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
    if -1 not in sizes and math.prod(sizes) < jax.device_count():
        return make_mesh(mesh_cfg, devices=jax.devices()[: math.prod(sizes)])
    return make_mesh(mesh_cfg)


def _rules_dict(rules: Rules | None) -> dict[str, Any]:
    rules = DEFAULT_RULES if rules is None else rules
    out: dict[str, Any] = {}
    for item in rules:
        name, target = tuple(item)
        if name in out:
            raise ValueError(f"sharding rules name logical axis {name!r} twice")
        if isinstance(target, list):
            target = tuple(target)
        out[name] = target
    return out


def logical_to_spec(
    logical_axes: Sequence[str | None],
    rules: Rules | None = None,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array whose dims have these logical names.

    A mesh axis is used at most once per array (a later dim wanting a used axis is replicated). With
    `mesh` and `shape`, mesh axes of size 1 are dropped and a dim that its mesh axes do not divide is
    replicated rather than failing (e.g. 2 kv heads on tensor=4).
    """
    table = _rules_dict(rules)
    used: set[str] = set()
    spec: list[Any] = []
    for dim, name in enumerate(logical_axes):
        target = table.get(name) if name is not None else None
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        for a in axes:
            if a not in MESH_AXES:
                raise ValueError(f"sharding rule for {name!r} names unknown mesh axis {a!r} (axes: {MESH_AXES})")
        axes = tuple(a for a in axes if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if mesh.shape[a] > 1)
            if shape is not None and axes and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                axes = ()
        used.update(axes)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return PartitionSpec(*spec)


def shardings_for(logical_tree: Any, shapes: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """NamedSharding per leaf of `shapes` (arrays or ShapeDtypeStructs) from a tree of logical axis tuples."""
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    return jax.tree.map(
        lambda axes, s: NamedSharding(mesh, logical_to_spec(axes, rules, mesh, s.shape)),
        logical_tree,
        shapes,
        is_leaf=is_axes,
    )


def param_shardings(cfg: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """NamedSharding for every parameter of `cfg` (a models.ModelConfig; same tree as init_params),
    computed abstractly. Uses only the config's own `abstract_params()` / `param_logical_axes()`, so
    this module never imports `mpa_jax.models` (models may import sharding, not the reverse)."""
    return shardings_for(cfg.param_logical_axes(), cfg.abstract_params(), mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules | None = None, ndim: int = 2) -> NamedSharding:
    """Sharding for a [batch, length, ...] input array: batch by the `batch` rule, the rest replicated."""
    spec = logical_to_spec(("batch",) + (None,) * (ndim - 1), rules, mesh)
    return NamedSharding(mesh, spec)


def shard_batch(batch: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Place every array of a batch pytree with batch_sharding (leading dim = batch)."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, rules, np.ndim(x))), batch)


def shard_params(params: Any, cfg: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Move an existing params tree into the shardings the rules give."""
    return jax.device_put(params, param_shardings(cfg, mesh, rules))


def per_device_bytes(shapes: Any, shardings: Any) -> dict[Any, int]:
    """Bytes each device would hold for arrays `shapes` (ShapeDtypeStructs) placed by `shardings`."""
    totals: dict[Any, int] = {}
    for s, sh in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))):
        shard = sh.shard_shape(s.shape)
        nbytes = int(np.prod(shard, dtype=np.int64)) * np.dtype(s.dtype).itemsize
        for d in sh.mesh.devices.flat:
            totals[d] = totals.get(d, 0) + nbytes
    return totals


def rules_from_config(config: Any) -> tuple[tuple[str, Any], ...]:
    """The `sharding_rules` of an experiment config (a ConfigDict or a mapping), as a tuple of pairs."""
    return tuple(tuple(r) for r in config["sharding_rules"])


def describe(mesh: Mesh) -> str:
    """Short text such as 'data=2 fsdp=2 tensor=2 expert=1'."""
    return " ".join(f"{a}={mesh.shape[a]}" for a in mesh.axis_names)


# ---- activation sharding ------------------------------------------------------------------------------
# Inside a traced step, activations are pinned to their logical axes (batch, length, embed, heads, mlp,
# vocab) so that XLA's propagation cannot pick a layout that needs a hidden gather (e.g. replicating the
# [B, T, D] stream over the tensor axis and then all-gathering a weight instead). The mesh and rules
# come from `activation_sharding(mesh, rules)`, entered around the traced function; outside it
# `constrain` does nothing (single-device code and tests stay as they are).
_ACTIVATION: list[tuple[Mesh, Rules | None]] = []


class activation_sharding:
    """Context manager: `constrain` uses `mesh` and `rules` while it is active (trace time)."""

    def __init__(self, mesh: Mesh | None, rules: Rules | None = None):
        self.entry = None if mesh is None else (mesh, rules)

    def __enter__(self) -> "activation_sharding":
        if self.entry is not None:
            _ACTIVATION.append(self.entry)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.entry is not None:
            _ACTIVATION.pop()


def current_activation_mesh() -> tuple[Mesh, Rules | None] | None:
    """The (mesh, rules) of the innermost `activation_sharding`, or None."""
    return _ACTIVATION[-1] if _ACTIVATION else None


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`x` with a sharding constraint from its logical axes (no-op outside `activation_sharding`)."""
    ctx = current_activation_mesh()
    if ctx is None:
        return x
    mesh, rules = ctx
    spec = logical_to_spec(tuple(logical_axes), rules, mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def mesh_axes_for(logical: str, mesh: Mesh, rules: Rules | None = None) -> tuple[str, ...]:
    """The mesh axes (of size > 1) that the rules map one logical axis to."""
    target = _rules_dict(rules).get(logical)
    axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    return tuple(a for a in axes if mesh.shape[a] > 1)
