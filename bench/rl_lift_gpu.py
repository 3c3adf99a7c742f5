"""The RL-lift experiment at Qwen3-1.7B shape on one GPU (issue 28 item 5): as much of it as a device loan
allows, and the whole experiment's wall time estimated from what was measured.

    python bench/rl_lift_gpu.py --workdir runs/lift_gpu --init HF_DIR           # one CARE arm to rl.steps, timed
    python bench/rl_lift_gpu.py --workdir runs/lift_gpu --smoke                  # 1 step on 16 + 8 tasks (a short loan)
    python bench/rl_lift_gpu.py --workdir /tmp/w --smoke --dry-run --device cpu  # the same path, tiny, on CPU

Stages, each timed (figures printed as they come and written to WORKDIR/figures.json):

- plan: `mpa plan --config configs/rl_lift_gpu.py --devices 1` (per-device memory, SFT-step FLOPs);
- init: `--init` (a released Qwen3-1.7B after the planning cold start, configs/rl_lift_gpu.py's docstring)
  or, with none (no model hub offline), random weights at the shape with the starter's tokenizer, which
  times every part but never succeeds (its episodes run to `rollout.max_turns` x `max_new_tokens`);
- rl-step: bench/rl_step.py's RL iteration at the shape (sample 64 completions, update, weight sync);
- lift: `mpa experiment rl-lift` (`rl_lift`) with configs/rl_lift_gpu.py: one CARE arm to `--steps`,
  its start and step evaluations on the 144 dev tasks (`--smoke`: 1 step, 16 + 8 tasks);
- estimate: the full experiment (start evaluation, 2 algos x 2 seeds x rl.steps steps, an evaluation
  every 25 steps) from the measured seconds per output token of evaluation and rollouts, per RL
  update and per checkpoint+export, at the CPU run's episode lengths (`--tokens-per-episode`, the
  starter's greedy dev figure) where the random policy's episodes are longer.

`--dry-run` shrinks width and depth (bench/rl_step.py's shrink; the recipe's flags kept) so the whole path
runs on CPU: tests/integration/test_benches.py runs it.

Run on one H200 on 2026-12-04 (docs/perf.md "On a lent H200"): the rl-step stage took 13.5 s per iteration; the
smoke's start evaluation was still compiling prefill widths (11-23 s each) when the 15-minute loan ended.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "rl_lift_gpu.py")


def lift_config(dry_run: bool, smoke: bool):
    """configs/rl_lift_gpu.py; `dry_run`: a tiny width and depth over the starter's vocabulary; `smoke`: one
    re-draw at most (a random policy's groups are all failures, and re-drawing them only repeats the timing)."""
    from mpa_jax.config import load_config_file

    c = load_config_file(CONFIG)
    if dry_run:
        m = c.model
        m.hidden_size, m.intermediate_size, m.num_hidden_layers = 64, 128, 2
        m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.vocab_size = 4, 2, 16, 4096
        m.logprob_chunk = 1024
        c.rl.tasks_per_step, c.rl.group_size = 2, 2
    if smoke:
        c.rl.select_tries = 1
    return c


def random_init(config, out_dir: str) -> str:
    """Random weights at the config's model shape, saved as an HF dir with the starter's tokenizer."""
    import jax

    from mpa_jax import models, sharding

    if os.path.exists(os.path.join(out_dir, "config.json")):
        return out_dir
    cfg = models.config_from_ml(config.model)
    mesh = sharding.make_learner_mesh(config.mesh)
    params = models.init_params(cfg, jax.random.key(0), mesh, sharding.rules_from_config(config))
    models.save_pretrained(models.Model(cfg, params), out_dir, tokenizer_dir=os.path.join(ROOT, "starter"), dtype="bfloat16")
    return out_dir


def _eval_figures(eval_dir: str) -> dict[str, float]:
    """Wall seconds, tasks, success and output tokens of one evaluation (its eval.json and run summary)."""
    with open(os.path.join(eval_dir, "eval.json"), encoding="utf-8") as f:
        rep = json.load(f)
    off = rep["harness"]["off"]["overall"]
    return {"wall_s": float(rep["wall_s"]), "tasks": float(rep["tasks"]), "success": float(off["success"]),
            "output_tokens": float(off["mean_output_tokens"]),
            "s_per_output_token": float(rep["wall_s"]) / max(float(off["mean_output_tokens"]) * float(rep["tasks"]), 1.0)}


def _rl_figures(run_dir: str) -> dict[str, float]:
    """Mean per-step times and rollout sizes of an RL run (its metrics.jsonl)."""
    from mpa_jax.train.metrics import read_metrics

    rows = list({int(r["step"]): r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))}.values())
    mean = lambda k: sum(float(r.get(k, 0.0)) for r in rows) / max(len(rows), 1)  # noqa: E731
    return {"steps": float(len(rows)), "rollout_s": mean("time/rollout_s"), "train_s": mean("time/train_s"),
            "sync_s": mean("time/sync_s"), "episodes": mean("rl/rollouts"), "groups_drawn": mean("rl/groups_drawn"),
            "output_tokens": mean("rl/output_tokens")}


def estimate(fig: dict, config, tokens_per_episode: float, seeds: int = 2, algos: int = 2, eval_every: int = 25,
             n_tasks: int = 144) -> dict[str, float]:
    """The full experiment's hours from the measured rates (see the module docstring)."""
    steps = int(config.rl.steps)
    ev = fig["lift"]["start_eval"]
    eval_s = ev["s_per_output_token"] * tokens_per_episode * n_tasks
    rl = fig["lift"]["rl"]
    # rollouts: seconds per output token over every drawn episode (kept or not; a drawn episode is as long as
    # the same policy's evaluation episodes), at the recipe's batch and ~1.5 draws per kept group (CPU run)
    drawn = max(rl["groups_drawn"] * int(config.rl.group_size), 1.0)
    per_token = rl["rollout_s"] / (drawn * max(ev["output_tokens"], 1.0))
    rollout_s = per_token * tokens_per_episode * int(config.rl.tasks_per_step) * int(config.rl.group_size) * 1.5
    # the update: the lift run's own where it trained, else bench/rl_step.py's (64 sequences of 1,280 tokens)
    upd = rl if rl["train_s"] > 0.01 * rl["rollout_s"] else fig.get("rl-step", {})
    train_s = float(upd.get("train_s", float("nan"))) + float(upd.get("sync_s", 0.0))
    step_s = rollout_s + train_s + fig["lift"]["checkpoint_export_s"] / int(config.rl.checkpoint_every)
    arm_s = steps * step_s + (steps // eval_every) * (eval_s + fig["lift"]["checkpoint_export_s"])
    total_s = eval_s + seeds * algos * arm_s
    return {"eval_s": eval_s, "rl_rollout_s": rollout_s, "rl_update_s": train_s, "rl_step_s": step_s, "arm_h": arm_s / 3600, "total_h": total_s / 3600,
            "tokens_per_episode": tokens_per_episode}


def _stage(name: str, fig: dict, fn, path: str):
    t0 = time.perf_counter()
    try:
        fig[name] = fn()
    except Exception as e:  # a stage that fails on a new machine still leaves the figures of the others
        traceback.print_exc()
        fig[name] = {"error": f"{type(e).__name__}: {e}"}
    fig[name + "_wall_s"] = time.perf_counter() - t0
    print(f"[{name}] {time.perf_counter() - t0:.1f} s: {json.dumps(fig[name], sort_keys=True, default=str)}", flush=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fig, f, indent=1, sort_keys=True, default=str)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--init", default=None, help="an HF dir at the shape (default: random weights, timing only)")
    p.add_argument("--smoke", action="store_true", help="1 RL step, evaluations on 16 + 8 dev tasks")
    p.add_argument("--steps", type=int, default=None, help="RL steps of the one arm run here (default: rl.steps; --smoke: 1)")
    p.add_argument("--device", choices=("any", "cpu", "gpu"), default="gpu", help="require this JAX backend (exit 2 otherwise)")
    p.add_argument("--dry-run", action="store_true", help="a tiny width and depth (CPU check of the whole path)")
    p.add_argument("--skip", default="", help="comma-separated stages to leave out (rl-step, lift)")
    p.add_argument("--tokens-per-episode", type=float, default=110.4, help="output tokens per episode for the estimate "
                   "(default: the starter's greedy dev figure, docs/experiments.md)")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    # rl-step runs in a process of its own beside this one: neither may take most of the GPU up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    backend = jax.default_backend()
    if args.device != "any" and backend != args.device:
        print(f"--device {args.device}: JAX's backend is {backend}", file=sys.stderr)
        return 2
    os.makedirs(args.workdir, exist_ok=True)
    path = os.path.join(args.workdir, "figures.json")
    skip = {s for s in args.skip.split(",") if s}
    config = lift_config(args.dry_run, args.smoke)
    fig: dict = {"backend": backend, "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
                 "model": {k: int(config.model[k]) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}}
    print(f"{backend} ({fig['device_kind']}), jax {jax.__version__}: {fig['model']}", flush=True)

    def plan():
        from mpa_jax.train.memory import plan as memory_plan

        return memory_plan(config, 1)

    _stage("plan", fig, plan, path)
    if "rl-step" not in skip:
        def rl_step(attention: str):
            cmd = [sys.executable, os.path.join(ROOT, "bench", "rl_step.py"), "--shape", "qwen3_1_7b", "--device", args.device,
                   "--attention", attention]
            cmd += (["--dry-run", "--prompt-len", "64", "--completion-len", "16", "--iters", "1", "--tasks", "2", "--group", "2"]
                    if args.dry_run else ["--prompt-len", "1024", "--completion-len", "256", "--iters", "2"])
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)  # its own process: the GPU memory is freed after
            print(res.stdout + res.stderr[-3000:], flush=True)
            if res.returncode:
                raise RuntimeError(f"bench/rl_step.py --attention {attention} exited {res.returncode}")
            line = next(ln for ln in res.stdout.splitlines() if ln.startswith("ours: "))
            toks = line[len("ours: "):].split()
            return {"attention": attention, **{toks[i]: float(toks[i + 1]) for i in range(0, len(toks), 2)}}

        _stage("rl-step", fig, lambda: rl_step(str(config.model.attention_impl)), path)
        if "error" in fig["rl-step"] and config.model.attention_impl != "xla":  # cuDNN refused: the lift runs on XLA's
            fig["rl-step-refused"] = fig["rl-step"]
            config.model.attention_impl = "xla"
            _stage("rl-step", fig, lambda: rl_step("xla"), path)
    if "lift" in skip:
        return 0
    init = args.init
    if init is None:
        _stage("init", fig, lambda: {"dir": random_init(config, os.path.join(args.workdir, "random_init"))}, path)
        init = os.path.join(args.workdir, "random_init")
    steps = args.steps or (1 if args.smoke else int(config.rl.steps))
    n_seen, n_held = (4, 2) if args.dry_run else (16, 8) if args.smoke else (96, 48)

    def lift():
        from mpa_jax.experiments.rl_lift import rl_lift

        wd = os.path.join(args.workdir, "lift")
        rl_lift(config, wd, init=init, seeds=1, algos=("care",), eval_every=steps, until=steps, n_seen=n_seen,
                n_held_out=n_held, progress=False)
        run_dir = os.path.join(wd, f"care-s{int(config.seed)}")
        # checkpoint + export: from the RL run's last metrics row to the export's last file
        last_metrics = os.path.getmtime(os.path.join(run_dir, "metrics.jsonl"))
        exported = max(os.path.getmtime(f) for f in glob.glob(os.path.join(run_dir, "hf", f"step_{steps}", "*")))
        return {"start_eval": _eval_figures(os.path.join(wd, "eval", "start")),
                "step_eval": _eval_figures(os.path.join(run_dir, "eval", f"step_{steps}")),
                "rl": _rl_figures(run_dir), "checkpoint_export_s": max(exported - last_metrics, 0.0)}

    _stage("lift", fig, lift, path)
    if "error" not in fig["lift"]:
        _stage("estimate", fig, lambda: estimate(fig, config, args.tokens_per_episode), path)
    return 0 if all("error" not in v for k, v in fig.items() if isinstance(v, dict) and k != "rl-step-refused") else 1


if __name__ == "__main__":
    sys.exit(main())
