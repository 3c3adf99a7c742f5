"""Per-device memory of a config's training state, from its abstract build (nothing allocated).

    python -m mpa_jax.train.memory --config configs/qwen3_8b.py --devices 8 [--devices 64 ...]

Uses an abstract mesh of the given size (no devices needed), the config's mesh and sharding rules,
`jax.eval_shape` of the parameters and of the optimizer state, and sums each array's shard bytes.
Activations are not included (they depend on seq_len, batch and remat; see docs/scaling.md).
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

    cfg = models.config_from_ml(config.model)
    mesh = abstract_mesh(config.mesh, num_devices)
    rules = sharding.rules_from_config(config)
    pshape = cfg.abstract_params()
    psh = sharding.shardings_for(models.param_logical_axes(cfg), pshape, mesh, rules)
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
