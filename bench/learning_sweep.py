"""Where learning comes from, on a CPU: micro SFT runs (mpa_jax.sft.micro) over a grid, as markdown tables.

    python bench/learning_sweep.py --out runs/sweep \
        --templates contact_group.create,folder.create --steps 200 --eval-every 50 \
        --size 1x64 2x128 4x256 --data 16 32 64 128 --context compact/none json/full compact/full \
        --dp 1 2 --dp-steps 5 --dp-repeats 2

Every axis is varied around one base cell (--base-size, --base-data, --base-context; the base cell runs
once and appears in every axis' table). A cell is one `python -m mpa_jax.sft.micro` subprocess on one host
device: the given templates' train-split oracle demonstrations (`data` instances per template, plus
--loss-tasks more held out for the held-out loss), a micro Qwen3 of `size` (layers x hidden), `steps` SFT
steps; greedy task success on the dev split's instances (other persona worlds and seeds) and the held-out
loss every --eval-every steps. Results go to <out>/results.jsonl and a finished cell is not run again.

--dp D1 D2 times the SFT step at the starter's shape (configs/starter.py: 8 x 1024 rows, bf16 compute) in
one subprocess per device count, with XLA_FLAGS=--xla_force_host_platform_device_count=D and the batch
rows over a data-parallel mesh of all D host devices; the counts alternate --dp-repeats times, side by
side, so that the ratio is measured under the same load. --dry-run prints the cells' commands only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cell_key(size: str, data: int, ctx: str) -> str:
    return f"{size}-{data}-{ctx.replace('/', '_')}"


def cell_command(a: argparse.Namespace, size: str, data: int, ctx: str) -> list[str]:
    """The `mpa_jax.sft.micro` command of one grid cell."""
    layers, hidden = (int(x) for x in size.split("x"))
    fmt, reasoning = ctx.split("/")
    return [sys.executable, "-m", "mpa_jax.sft.micro", "--workdir", os.path.join(a.out, cell_key(size, data, ctx)),
            "--template", a.templates, "--train", str(data), "--dev", str(a.dev), "--steps", str(a.steps),
            "--hidden", str(hidden), "--layers", str(layers), "--lr", str(a.lr), "--format", fmt, "--reasoning", reasoning,
            "--eval-every", str(a.eval_every), "--loss-tasks", str(a.loss_tasks)]


def run_cell(a: argparse.Namespace, size: str, data: int, ctx: str, done: dict[str, Any]) -> dict[str, Any]:
    """Run one cell (or return its stored result)."""
    key = cell_key(size, data, ctx)
    if key in done:
        return done[key]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    t0 = time.perf_counter()
    res = subprocess.run(cell_command(a, size, data, ctx), capture_output=True, text=True, cwd=ROOT, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"cell {key} failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out.update(key=key, size=size, data=data, ctx=ctx, wall_s=time.perf_counter() - t0)
    with open(os.path.join(a.out, "results.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(out) + "\n")
    done[key] = out
    print(f"[{key}] success {100 * out['success']:.0f}% {out['by_template']} in {out['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return out


def axis_table(axis: str, cells: list[dict[str, Any]]) -> str:
    """One markdown row per (cell, eval point): success against steps, training seconds and held-out loss."""
    lines = [f"| {axis} | step | train s | held-out loss | success (greedy, dev) | final: by template | train loss | unigram | episode tokens | cell wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        label = {"size": c["size"], "data": f"{c['data']} / template", "context": c["ctx"]}[axis]
        dev = c["dev_tasks"]
        for i, p in enumerate(c["curve"]):
            last = i == len(c["curve"]) - 1
            loss = f"{p['loss']:.3f}" if "loss" in p else "-"
            succ = f"{100 * p['success']:.0f}% ({round(p['success'] * dev)}/{dev})" if "success" in p else "-"
            tail = (f"{', '.join(f'{k}: {v}' for k, v in c['by_template'].items())} | {c['train_loss']:.3f} | {c['unigram_loss']:.2f} | "
                    f"{c['mean_episode_tokens']:.0f} | {c['wall_s']:.0f}") if last else " | | | | "
            lines.append(f"| {label if i == 0 else ''} | {p['step']} | {p['train_seconds']:.0f} | {loss} | {succ} | {tail} |")
    return "\n".join(lines)


def step_time(config_path: str, steps: int) -> dict[str, Any]:
    """Seconds per SFT step of `config_path`'s model and batch over a data-parallel mesh of all host devices
    (random tokens, every row full): called inside the subprocess whose XLA_FLAGS set the device count."""
    import jax
    import numpy as np

    from mpa_jax import models, sharding
    from mpa_jax.config import load_config_file
    from mpa_jax.sft.loss import make_sft_loss
    from mpa_jax.train import optimizer as optlib
    from mpa_jax.train import state as statelib
    from mpa_jax.train import step as steplib

    config = load_config_file(config_path)
    rows, seq = int(config.sft.batch_size), int(config.sft.seq_len)
    cfg = models.config_from_ml(config.model)
    mesh = sharding.make_mesh({"data": jax.device_count(), "fsdp": 1, "tensor": 1, "expert": 1})
    rules = sharding.rules_from_config(config)
    opt, sched = optlib.optimizer_from_config(config.sft)
    fam = models.registry.family_module(cfg.family)
    pshape = jax.eval_shape(lambda r: fam.init_params(cfg, r), jax.random.key(0))
    ssh = statelib.state_shardings(mesh, pshape, sharding.param_shardings(cfg, mesh, rules), opt)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=(rows, seq + 1)).astype(np.int32)
    batch = {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "loss_weights": np.ones((rows, seq), np.int32),
             "segment_ids": np.ones((rows, seq), np.int32),
             "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy()}
    bsh = {k: sharding.batch_sharding(mesh, rules) for k in batch}
    state = statelib.create_sharded_state(lambda r: fam.init_params(cfg, r), opt, 0, ssh)
    step = steplib.make_train_step(make_sft_loss(cfg, int(config.model.logprob_chunk)), opt, ssh, bsh, schedule=sched)
    dev = {k: jax.device_put(v, bsh[k]) for k, v in batch.items()}
    state, m = step(state, dev)  # compile + warm-up
    jax.block_until_ready(m)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = step(state, dev)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    return {"devices": jax.device_count(), "rows": rows, "seq_len": seq, "dtype": str(config.model.compute_dtype),
            "median_s": float(np.median(times)), "min_s": min(times), "loss": float(m["loss"])}


def dp_table(a: argparse.Namespace) -> str:
    """Alternate one subprocess per device count, --dp-repeats times; a table of ms/step and the ratio to 1 device."""
    rows: list[dict[str, Any]] = []
    for r in range(a.dp_repeats):
        for d in a.dp:
            env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={d}")
            cmd = [sys.executable, os.path.abspath(__file__), "--_step-time", a.dp_config, "--dp-steps", str(a.dp_steps)]
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
            if res.returncode != 0:
                raise RuntimeError(f"step time with {d} devices failed:\n{res.stderr[-3000:]}")
            out = json.loads(res.stdout.strip().splitlines()[-1])
            out["round"] = r + 1
            rows.append(out)
            print(f"[dp {d}] round {r + 1}: {1000 * out['median_s']:.0f} ms/step", file=sys.stderr, flush=True)
    lines = [f"| host devices (data-parallel) | round | ms/step (median of {a.dp_steps}) | min | tokens/s | vs the same round's first count |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        base = next(x for x in rows if x["round"] == row["round"])
        lines.append(f"| {row['devices']} | {row['round']} | {1000 * row['median_s']:.0f} | {1000 * row['min_s']:.0f} | "
                     f"{row['rows'] * row['seq_len'] / row['median_s']:,.0f} | {base['median_s'] / row['median_s']:.2f}x |")
    shape = rows[0]
    return f"SFT step of {os.path.relpath(a.dp_config, ROOT)}: {shape['rows']} x {shape['seq_len']} tokens, compute {shape['dtype']}\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "learning_sweep"))
    p.add_argument("--templates", default="contact_group.create,folder.create", help="comma-separated train templates")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--dev", type=int, default=8, help="dev instances per template (greedy success)")
    p.add_argument("--loss-tasks", type=int, default=8, help="train-split instances per template held out for the loss")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--base-size", default="2x128", help="layers x hidden of the base cell")
    p.add_argument("--base-data", type=int, default=64, help="train instances per template of the base cell")
    p.add_argument("--base-context", default="compact/none", help="format/reasoning of the base cell")
    p.add_argument("--size", nargs="*", default=[], help="model sizes (layers x hidden) to sweep")
    p.add_argument("--data", nargs="*", type=int, default=[], help="train instances per template to sweep")
    p.add_argument("--context", nargs="*", default=[], help="context format/reasoning values to sweep")
    p.add_argument("--dp", nargs="*", type=int, default=[], help="host device counts to time the starter's SFT step on")
    p.add_argument("--dp-config", default=os.path.join(ROOT, "configs", "starter.py"))
    p.add_argument("--dp-steps", type=int, default=5)
    p.add_argument("--dp-repeats", type=int, default=2)
    p.add_argument("--dry-run", action="store_true", help="print the cells' commands, run nothing")
    p.add_argument("--_step-time", dest="step_time", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.step_time:
        print(json.dumps(step_time(a.step_time, a.dp_steps)))
        return 0
    for s in a.size + [a.base_size]:
        parts = s.split("x")
        if len(parts) != 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            p.error(f"model size {s!r}: expected LAYERSxHIDDEN, e.g. 2x128")
    for ctx in a.context + [a.base_context]:
        fmt, _, reasoning = ctx.partition("/")
        if fmt not in ("compact", "json") or reasoning not in ("none", "full"):
            p.error(f"context {ctx!r}: expected compact|json / none|full, e.g. compact/none")
    if any(d < 1 for d in a.data + a.dp) or a.base_data < 1:
        p.error("data sizes and device counts must be >= 1")
    axes = [("size", [(s, a.base_data, a.base_context) for s in a.size]),
            ("data", [(a.base_size, d, a.base_context) for d in a.data]),
            ("context", [(a.base_size, a.base_data, c) for c in a.context])]
    if a.dry_run:
        for axis, cells in axes:
            for cell in cells:
                print(axis, " ".join(cell_command(a, *cell)))
        return 0
    os.makedirs(a.out, exist_ok=True)
    done: dict[str, Any] = {}
    path = os.path.join(a.out, "results.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    done[r["key"]] = r
    print(f"templates {a.templates}; {a.steps} steps of 8 x (512 compact | 2048 json) rows, lr {a.lr}; greedy success on "
          f"{a.dev} dev instances per template, held-out loss on {a.loss_tasks} held-out train instances per template; "
          f"base cell {a.base_size} / {a.base_data} per template / {a.base_context}; one host device per cell\n")
    for axis, cells in axes:
        if cells:
            results = [run_cell(a, *cell, done) for cell in cells]
            print(f"### {axis}\n\n{axis_table(axis, results)}\n", flush=True)
    if a.dp:
        print(f"### data-parallel\n\n{dp_table(a)}\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
