"""`mpa plan --config configs/NAME.py [--devices N] [--config.mesh.*=...]`: per-device memory and FLOPs
of the config's SFT step from the abstract build (nothing allocated, no devices needed)."""
from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = 'example: mpa plan --config qwen3_8b --devices 8'
    parser.add_argument("--devices", type=int, default=8, help="number of devices the mesh spreads over (default 8)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError
    from mpa_jax.train.memory import format_plan, plan

    if args.devices < 1:
        raise UserError(f"--devices must be positive, got {args.devices}")
    try:
        p = plan(config, args.devices)
    except ValueError as e:  # a mesh that does not divide the devices, a bad model field
        raise UserError(str(e)) from None
    print(json.dumps(p, indent=2, sort_keys=True) if args.json else format_plan(p))
    return 0
