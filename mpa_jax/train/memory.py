"""Per-device memory of a config's training state, from its abstract build (nothing allocated).

    python -m mpa_jax.train.memory --config configs/qwen3_8b.py --devices 8 [--devices 64 ...]

Uses an abstract mesh of the given size (no devices needed), the config's mesh and sharding rules,
`jax.eval_shape` of the parameters and of the optimizer state, and sums each array's shard bytes.
`plan` adds gradients, activations under the remat policy, the engine's KV cache and FLOPs per step
(what `mpa plan` prints).
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding


def abstract_mesh(mesh_cfg: Any, num_devices: int) -> jax.sharding.AbstractMesh:
    """An AbstractMesh over (data, fsdp, tensor, expert) sized from the config for `num_devices`."""
    from mpa_jax import sharding

    shape = sharding.mesh_shape(mesh_cfg, num_devices)
    return jax.sharding.AbstractMesh(tuple(shape), sharding.MESH_AXES)


def _bytes(shapes: Any, shardings: Any) -> int:
    total = 0
    for s, sh in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))):
        total += int(np.prod(sh.shard_shape(s.shape), dtype=np.int64)) * np.dtype(s.dtype).itemsize
    return total


def state_bytes_per_device(config: Any, num_devices: int) -> dict[str, Any]:
    """{'mesh': {...}, 'params': bytes, 'optimizer': bytes, 'total': bytes, 'param_count': n} for one device."""
    from mpa_jax import models, sharding
    from mpa_jax.train import optimizer as optlib
    from mpa_jax.train import state as statelib

    cfg, _ = models.run_model_config(config)
    mesh = abstract_mesh(config.mesh, num_devices)
    rules = sharding.rules_from_config(config)
    pshape = cfg.abstract_params()
    psh = sharding.shardings_for(cfg.param_logical_axes(), pshape, mesh, rules)
    opt, _ = optlib.optimizer_from_config(config.sft)
    ssh = statelib.state_shardings(mesh, pshape, psh, opt)
    oshape = jax.eval_shape(opt.init, pshape)
    p, o = _bytes(pshape, psh), _bytes(oshape, ssh.opt_state)
    return {
        "mesh": dict(mesh.shape),
        "params": p,
        "optimizer": o,
        "total": p + o,
        "param_count": int(sum(math.prod(x.shape) for x in jax.tree.leaves(pshape))),
    }


# ---- the full plan: state + activations + engine KV cache + FLOPs -------------------------------------
# Device memory (bytes) of the devices `mpa plan` knows. Fits = the plan's total within FIT_FRACTION of
# it (the rest for XLA's runtime, fragmentation and collectives' buffers).
DEVICES = {
    "H100-80G": 80 * 10**9,
    "H200-141G": 141 * 10**9,
    "v5p": 95 * 2**30,
    "v6e": 32 * 2**30,
}
FIT_FRACTION = 0.9


def _layer_kinds(cfg: Any) -> list[str]:
    if cfg.family == "qwen3":
        return ["full_attention"] * cfg.num_hidden_layers
    from mpa_jax.models import qwen3_5

    return list(qwen3_5.layer_types(cfg))


def _per_token_layer_bytes(cfg: Any, kind: str, seq_len: int, itemsize: int) -> tuple[int, int, int]:
    """(all saved activations, dot outputs only, layer input) bytes per token of one layer in the
    backward pass without remat, in the compute dtype; XLA attention adds its [heads, T] scores."""
    d, h = cfg.hidden_size, cfg.head_dim
    if kind == "full_attention":
        q = cfg.num_attention_heads * h * (2 if cfg.family != "qwen3" else 1)  # Qwen3.5 q_proj also yields the gate
        kv = 2 * cfg.num_key_value_heads * h
        mix_dots = q + kv + d  # q, k, v, o_proj
        mix_all = mix_dots + 2 * d + cfg.num_attention_heads * h  # + norm, residual, attention output
        scores = 4 * cfg.num_attention_heads * seq_len // itemsize if cfg.attention_impl == "xla" else 0  # float32 probs
        mix_all += scores
        mix_dots += scores
    else:  # Gated DeltaNet: q, k, v, z projections, a/b gates, conv, output norm and projection
        qk = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        vz = 2 * cfg.linear_num_value_heads * cfg.linear_value_head_dim
        mix_dots = qk + vz + 2 * cfg.linear_num_value_heads + d
        mix_all = mix_dots + (qk + vz) + 2 * d  # conv outputs, norms
    if cfg.num_experts > 0:
        inner = cfg.num_experts_per_tok * cfg.moe_intermediate_size + cfg.shared_expert_intermediate_size
        mlp_dots = 3 * inner + d + cfg.num_experts * 4 // itemsize  # router logits in float32
        mlp_all = mlp_dots + inner + 2 * d + d * cfg.num_experts_per_tok  # silu*up, norm, residual, gathered rows
    else:
        mlp_dots = 3 * cfg.intermediate_size + d
        mlp_all = mlp_dots + cfg.intermediate_size + 2 * d
    return (mix_all + mlp_all) * itemsize, (mix_dots + mlp_dots) * itemsize, d * itemsize


def activation_bytes(cfg: Any, tokens: int, seq_len: int, logprob_chunk: int) -> int:
    """Peak activation bytes of one forward+backward over `tokens` tokens on one device under cfg.remat.

    none: every layer's activations are kept; dots: only dot outputs (+ layer inputs); full: the
    layer inputs plus one layer's activations while it is recomputed. On top: the final hidden state
    and its gradient (float32) and one vocabulary chunk of logits, exp and gradient (float32).
    """
    from mpa_jax.models import layers as mlayers

    itemsize = np.dtype(mlayers.dtype_of(cfg.compute_dtype)).itemsize
    per = [_per_token_layer_bytes(cfg, k, seq_len, itemsize) for k in _layer_kinds(cfg)]
    if cfg.remat == "none":
        layers_b = sum(a for a, _, _ in per)
    elif cfg.remat in ("dots", "dots_no_batch"):
        layers_b = sum(dots + x for _, dots, x in per) + max(a for a, _, _ in per)
    else:
        layers_b = sum(x for _, _, x in per) + max(a for a, _, _ in per)
    chunk = min(logprob_chunk, cfg.vocab_size)
    head = 2 * cfg.hidden_size * 4 + 3 * chunk * 4
    return int(tokens * (layers_b + head))


def kv_cache_bytes(cfg: Any, batch: int, max_len: int) -> int:
    """The embedded engine's decode state for `batch` rows of `max_len` tokens (all devices together)."""
    from mpa_jax.models import layers as mlayers

    itemsize = np.dtype(mlayers.dtype_of(cfg.compute_dtype)).itemsize
    total = 0
    for kind in _layer_kinds(cfg):
        if kind == "full_attention":
            total += 2 * batch * max_len * cfg.num_key_value_heads * cfg.head_dim * itemsize
        else:  # recurrent state (float32) + conv window
            state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
            conv = (cfg.linear_conv_kernel_dim - 1) * (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                                                       + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * itemsize
            total += batch * (state + conv)
    return total + batch * max_len  # kv_mask


def plan(config: Any, num_devices: int) -> dict[str, Any]:
    """Per-device bytes and FLOPs of one SFT step of `config` on `num_devices` devices, from the abstract
    build only (nothing allocated, no devices needed): params, optimizer state, gradients, activations
    under the remat policy, the embedded engine's KV cache; FLOPs per step; fits per device kind."""
    from mpa_jax import models, sharding
    from mpa_jax.train import metrics as mlib

    state = state_bytes_per_device(config, num_devices)
    cfg, _ = models.run_model_config(config)
    mesh = state["mesh"]
    rules = sharding.rules_from_config(config)
    batch_axes = sharding.mesh_axes_for("batch", abstract_mesh(config.mesh, num_devices), rules)
    dp = math.prod(mesh[a] for a in batch_axes)
    sft = config.sft
    rows, seq_len, micro = int(sft.batch_size), int(sft.seq_len), int(sft.micro_batches)
    rows_dev = max(1, rows // micro // dp)
    acts = activation_bytes(cfg, rows_dev * seq_len, seq_len, int(config.model.logprob_chunk))
    ro = config.rollout
    kv = kv_cache_bytes(cfg, int(ro.batch_size), int(ro.max_total_tokens))
    kv_dev = kv // num_devices if bool(ro.sharded) else kv
    grads = state["params"]  # float32 gradients, sharded like the parameters
    total = state["params"] + state["optimizer"] + grads + acts
    shapes = cfg.abstract_params()
    n = state["param_count"]
    routed = sum(int(math.prod(x.shape)) for path, x in jax.tree_util.tree_flatten_with_path(shapes)[0]
                 if "experts" in [getattr(k, "key", None) for k in path])
    active = n - routed + (routed * cfg.num_experts_per_tok // cfg.num_experts if cfg.num_experts else 0)
    attn_layers = sum(k == "full_attention" for k in _layer_kinds(cfg))
    flops = mlib.train_flops_per_token(active, attn_layers, seq_len, cfg.num_attention_heads * cfg.head_dim) * rows * seq_len
    return {
        "config": str(config.name),
        "devices": num_devices,
        "mesh": mesh,
        "param_count": n,
        "active_params": active,
        "params": state["params"],
        "optimizer": state["optimizer"],
        "grads": grads,
        "activations": acts,
        "train_total": total,
        "kv_cache": kv_dev,
        "flops_per_step": flops,
        "flops_per_device": flops / num_devices,
        "fits": {name: (total + (kv_dev if bool(ro.sharded) else 0)) <= FIT_FRACTION * cap for name, cap in DEVICES.items()},
    }


def format_plan(p: dict[str, Any]) -> str:
    """The plan as the few lines `mpa plan` prints."""
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    mesh = " ".join(f"{k}={v}" for k, v in p["mesh"].items())
    lines = [
        f"{p['config']}: {p['param_count'] / 1e9:.2f} B parameters ({p['active_params'] / 1e9:.2f} B active) on {p['devices']} devices, mesh {mesh}",
        "per device:",
        f"  parameters   {gib(p['params'])}",
        f"  optimizer    {gib(p['optimizer'])}",
        f"  gradients    {gib(p['grads'])}",
        f"  activations  {gib(p['activations'])}",
        f"  train total  {gib(p['train_total'])}",
        f"  engine KV    {gib(p['kv_cache'])}",
        f"FLOPs per step {p['flops_per_step']:.3e} ({p['flops_per_device']:.3e} per device)",
        "fits (train total within " + f"{FIT_FRACTION:.0%} of device memory): "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in p["fits"].items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from mpa_jax.config import load_config_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--devices", type=int, action="append", required=True)
    args = ap.parse_args(argv)
    print("| config | devices | mesh (data, fsdp, tensor, expert) | params | params GiB/device | Adam state GiB/device | total GiB/device |")
    print("|---|---|---|---|---|---|---|")
    for path in args.config:
        config = load_config_file(path)
        for n in args.devices:
            try:
                r = state_bytes_per_device(config, n)
            except ValueError as e:
                print(f"| {path} | {n} | {e} | | | | |")
                continue
            mesh = ", ".join(str(v) for v in r["mesh"].values())
            print(f"| {path} | {n} | {mesh} | {r['param_count'] / 1e9:.2f} B | {r['params'] / 2**30:.2f} | {r['optimizer'] / 2**30:.2f} | {r['total'] / 2**30:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
