"""Scanned decoder layers (`cfg.scan_layers`): stacked parameters and one `lax.scan` over them.

Unrolled, a decoder of L layers is traced and compiled L times; scanned, once per *block*, so compile
time stops growing with depth. The block is the shortest repeating run of layer types: 1 layer for
Qwen3, `full_attention_interval` layers for Qwen3.5 (three Gated DeltaNet layers then one gated
attention layer). Parameters of block position j over all L/period blocks are stacked on a new
leading axis (logical axis "layers", never sharded):

    model.layers.<j>.<...>   [L/period, ...]      holds HF layers j, j+period, j+2*period, ...

`hf_names` gives the per-layer Hugging Face names of a stacked leaf, so `hf_io` loads and saves the
stacked layout as a stack of HF tensors (the checkpoint on disk is the same either way), and
`unstack` turns stacked parameters into the per-layer tree (decode loops use it).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

LAYERS = "layers"  # the logical axis of the stacked dimension (no sharding rule: replicated)


def block_period(types: Sequence[str]) -> int:
    """The shortest period p (dividing len(types)) with types[i] == types[i % p] for every i."""
    n = len(types)
    for p in range(1, n + 1):
        if n % p == 0 and all(types[i] == types[i % p] for i in range(n)):
            return p
    return n


def stack_specs(per_layer: Sequence[dict[str, Any]], period: int) -> dict[str, Any]:
    """Spec tree of the stacked layers: {str(j): layer j's spec with a leading [L/period] "layers" dim}."""
    from mpa_jax.models import specs

    n = len(per_layer)
    if n % period:
        raise ValueError(f"num_hidden_layers={n} is not a multiple of the scanned block of {period} layers")
    blocks = n // period

    def stack(s):
        shape, axes, kind = s
        return ((blocks,) + tuple(shape), (LAYERS,) + tuple(axes), kind)

    return {str(j): jax.tree.map(stack, per_layer[j], is_leaf=specs.is_spec) for j in range(period)}


def layer_index(j: int, b: int, period: int) -> int:
    """The HF layer number of block b, position j."""
    return b * period + j


def expand_layer_keys(keys: tuple[str, ...], period: int, blocks: int) -> list[tuple[str, ...]]:
    """Per-layer key paths (as the unrolled tree names them) of a stacked leaf's path, in stack order."""
    if len(keys) < 3 or keys[:2] != ("model", "layers"):
        return [keys]
    j = int(keys[2])
    return [keys[:2] + (str(layer_index(j, b, period)),) + keys[3:] for b in range(blocks)]


def run(stacked: dict[str, Any], x: jax.Array, fns: Sequence[Callable[[Any, jax.Array], tuple[jax.Array, Any]]]) -> tuple[jax.Array, Any]:
    """Apply the block's layer functions `fns` (position j gets `stacked[str(j)]`) over all blocks.

    Each fn is `(layer_params, x) -> (x, aux)` with aux an array or None (e.g. MoE router logits);
    returns (x, auxes stacked as [L, ...] in layer order, or None). Remat stays per layer: wrap each fn.
    """

    def body(h, p_block):
        auxes = []
        for j, fn in enumerate(fns):
            h, aux = fn(p_block[str(j)], h)
            if aux is not None:
                auxes.append(aux)
        return h, (jnp.stack(auxes) if auxes else None)

    x, ys = jax.lax.scan(body, x, {str(j): stacked[str(j)] for j in range(len(fns))})
    if ys is None:
        return x, None
    return x, ys.reshape((-1,) + ys.shape[2:])  # [blocks, positions, ...] -> [L, ...] in layer order


def unstack(stacked: dict[str, Any], period: int) -> dict[str, Any]:
    """The per-layer tree {str(n): layer params} of stacked layers (slices; cheap inside jit)."""
    blocks = jax.tree.leaves(stacked[str(0)])[0].shape[0]
    out = {}
    for b in range(blocks):
        for j in range(period):
            out[str(layer_index(j, b, period))] = jax.tree.map(lambda a, b=b: a[b], stacked[str(j)])
    return out


def stack(per_layer: dict[str, Any], period: int) -> dict[str, Any]:
    """Inverse of `unstack`: per-layer params {str(n): tree} -> stacked {str(j): tree [L/period, ...]}."""
    n = len(per_layer)
    return {
        str(j): jax.tree.map(lambda *xs: jnp.stack(xs), *[per_layer[str(layer_index(j, b, period))] for b in range(n // period)])
        for j in range(period)
    }
