"""RL step wall time before and after the one engine, side by side in one run (issue 31).

    python bench/rl_engine_step.py [--steps 3] [--tasks 8] [--group 8] [--starter starter]

`mpa rl` from the shipped starter (configs/starter.py with the starter's shape, tokenizer and compact
context; sandbox train tasks by cursor, `--tasks` x `--group` episodes per step, temperature 1, one learner
device, the engine's weight replicas over the host's cores) for `--steps` steps, twice:

- `batch`: the engine's `generate` replaced by its whole-batch program (`Engine.generate_batch`: bucketed
  prefill + one jitted decode loop per call), i.e. RL rollouts as they ran before the one engine;
- `slots`: the engine as `run_rl` uses it now (rounds of `generate` over the decode slots, `as_rounds`).

Both runs draw the same tasks with the same seeds; the injection defense is off unless `--security on`. On a
tree whose engine no longer has the whole-batch program (`generate_batch` runs the slots with the prefix cache
off), run `--modes batch` in an older tree (before issue 49) and `--modes slots` here, and compare per token
too (the two trees' seeds may draw other episodes). Per mode, the mean over steps 2..N (step 1 compiles)
of the step's rollout, update and sync seconds and their sum, and the training success of every step
(equal between modes up to float rounding of the sampled log-probs). Prints `BENCH_ROW` lines.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starter", default=os.path.join(ROOT, "starter"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "starter.py"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--modes", nargs="+", choices=["batch", "slots"], default=["batch", "slots"])
    ap.add_argument("--batch-size", type=int, default=0, help="rollout.batch_size: live episodes (and slots); 0: the config's")
    ap.add_argument("--model-dtype", default="", help="model.compute_dtype: the learner's and the engine's ('': the config's)")
    ap.add_argument("--engine-dtype", default="", help="rollout.compute_dtype: the engine's compute dtype ('': the model's)")
    ap.add_argument("--security", choices=("off", "on"), default="off",
                    help="the injection defense in the episodes (off: as a tree from before the defense runs them)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 compiles and is not counted)")
    cores = len(os.sched_getaffinity(0))
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={cores}").strip()

    from mpa_jax.config import load_config_file
    from mpa_jax.rl.trainer import run_rl
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.sft.starter import load_starter, with_starter

    config = with_starter(load_config_file(args.config), load_starter(args.starter))
    config.rl.steps, config.rl.tasks_per_step, config.rl.group_size = args.steps, args.tasks, args.group
    config.rl.save_rollouts = False
    config.mesh.data = 1
    if "security" in config:
        config.security.enabled = args.security == "on"
    if args.batch_size:
        config.rollout.batch_size = args.batch_size
    if args.model_dtype:
        config.model.compute_dtype = args.model_dtype
    if args.engine_dtype:
        config.rollout.compute_dtype = args.engine_dtype
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; starter planner, {args.steps} RL steps of "
          f"{args.tasks} x {args.group} sandbox episodes, temperature {config.rl.temperature}, "
          f"{config.rollout.batch_size} live episodes, engine computes in "
          f"{args.engine_dtype or config.model.compute_dtype}", flush=True)

    slots_rows = Engine.generate_rows
    results: dict[str, dict[str, float]] = {}
    for mode in args.modes:
        # batch: every round's generate runs the whole-batch program (the engine before the slots)
        Engine.generate_rows = (lambda self, prompts, params, seeds=None, top_logprobs=0:  # type: ignore[method-assign]
                                self.generate_batch(prompts, params, seeds, top_logprobs)) if mode == "batch" else slots_rows
        try:
            with tempfile.TemporaryDirectory(prefix=f"rl_engine_{mode}_") as wd:
                res = run_rl(config, wd, init=args.starter, progress=False)
        finally:
            Engine.generate_rows = slots_rows  # type: ignore[method-assign]
        hist = res.history[1:]
        mean = lambda k: sum(float(h[k]) for h in hist) / len(hist)  # noqa: E731
        r = {k: mean(f"time/{k}_s") for k in ("rollout", "train", "sync")}
        r["step"] = r["rollout"] + r["train"] + r["sync"]
        r["first_step"] = sum(float(res.history[0][f"time/{k}_s"]) for k in ("rollout", "train", "sync"))
        results[mode] = r
        r["output_tokens"] = mean("rl/output_tokens")
        print(f"{mode:>6}: output tokens per episode {r['output_tokens']:.1f}; step {r['step']:.1f} s "
              f"(rollout {r['rollout']:.1f}, update {r['train']:.1f}, sync {r['sync']:.2f}; "
              f"first step incl. compile {r['first_step']:.1f} s); training success per step "
              + " ".join(f"{float(h['rl/success']):.3f}" for h in res.history), flush=True)
    if "batch" in results and "slots" in results:
        b, s = results["batch"], results["slots"]
        print(f"RL step wall time, batch / slots: {b['step'] / s['step']:.2f}x (rollout {b['rollout'] / s['rollout']:.2f}x; > 1: the slots are faster)")
        for k, name in (("step", "RL step wall time"), ("rollout", "RL step rollout time")):
            print("BENCH_ROW " + json.dumps({"figure": f"{name} ({args.tasks}x{args.group} episodes, starter), one engine's slots",
                                             "unit": "s", "ours": round(s[k], 2), "peer": "whole-batch program (before)",
                                             "peer_value": round(b[k], 2), "direction": "lower"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
