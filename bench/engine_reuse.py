"""The prefix cache and bounded compilation, today's engine (a git ref, default this branch's merge base with
`main`) vs this tree, in one run.

    python bench/engine_reuse.py                               # 24 dev episodes, 4 tasks x G=4, 200-prompt mix
    python bench/engine_reuse.py --episodes 48 --base-ref cc209a8

Each side runs in its own process with its own source tree on `sys.path` (the base: `git archive REF`
unpacked under /tmp, so nothing in the repository changes), on the same tasks, seeds and settings:

- evaluation: the starter planner (`starter/`) plays `--episodes` dev episodes greedily, continuous
  schedule (each episode's next turn submitted when its feedback is ready: `Engine.submit`);
- RL step's groups: `--group` samples of each of `--tasks` dev tasks at temperature 1, rounds schedule (as
  `mpa rl` collects them: every batch on an idle engine);
- the injection defense (`security`) is off unless `--security on`: a base tree from before it plays the
  episodes without it, and equal episodes are what make the two engines' rates comparable;
- program mix: a small random model (2 layers, width 32), `--mix` prompts of 1..`--mix-max` tokens (4 new
  tokens each) through `generate` in batches of 8: the compiled programs it needs.

Printed per side: episodes/s (and per CPU second: the process's CPU time, all its threads, which the shared
host's load changes far less than wall time), prefill tokens computed per prompt-side token (the episode's final length
minus the tokens it sampled; the base computes every submitted prompt whole, padding not counted; this
tree: `stats()["prefill_tokens"]`), compiled programs (XLA compilations counted), wall seconds; and
BENCH_ROW lines (this tree vs the base). CPU figures: the host is shared, so wall times carry its load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args: argparse.Namespace) -> dict:
    """One side's measurements (run in a process whose sys.path starts with that side's tree)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.replicas}").strip()
    import jax
    import numpy as np

    import mpa_jax
    from mpa_jax import models
    from mpa_jax import tokenizer as tk
    from mpa_jax.config import load_config_file
    from mpa_jax.envs import load_tasks
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.runner import EpisodeConfig, EpisodeRunner
    from mpa_jax.rollout.types import SamplingParams
    from mpa_jax.sft.starter import load_starter, with_starter

    tree = os.path.dirname(os.path.dirname(os.path.abspath(mpa_jax.__file__)))
    config = with_starter(load_config_file(os.path.join(tree, "configs", "tiny.py")), load_starter(args.starter))
    if "security" in config:  # a tree from before the injection defense has no such section: it runs without one
        config.security.enabled = args.security == "on"
    tok = tk.load_tokenizer(args.starter)
    dev = load_tasks("dev")
    runner = EpisodeRunner.from_config(config, harness=False)
    slot_len = int(config.rollout.max_total_tokens)
    out: dict = {"tree": tree}

    class Counting:
        """The engine as the runner sees it, counting the prompt tokens submitted (what the base prefills)."""

        def __init__(self, engine, rounds: bool) -> None:
            self.engine, self.submitted = engine, 0
            if not rounds:
                self.submit = self._submit

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def _submit(self, prompt_ids, params, seed=None, **kw):
            self.submitted += len(prompt_ids)
            return self.engine.submit(prompt_ids, params, seed, **kw)

        def generate(self, prompts, params, seeds=None):
            self.submitted += sum(len(p) for p in prompts)
            return self.engine.generate(prompts, params, seeds)

    def run(tasks, cfg, slots: int, rounds: bool) -> dict:
        eng = Engine.from_pretrained(args.starter, dtype="float32", slots=slots, slot_len=slot_len, replicas=args.replicas,
                                     max_batch=slots, vocab_limit=tok.vocab_size)
        seen = Counting(eng, rounds)
        runner.run(seen, tok, tasks, cfg)  # warm: compiles what this load needs
        eng.update_weights(eng.params, "timed")  # a new weight version: nothing cached from the warm run
        c0, s0, n0 = eng.compiles, dict(eng.stats()), seen.submitted
        t0, cpu0 = time.perf_counter(), time.process_time()
        trajs = runner.run(seen, tok, tasks, cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        s1 = eng.stats()
        prompt_side = sum(len(t.tokens) - sum(t.loss_mask) for t in trajs)
        computed = s1["prefill_tokens"] - s0.get("prefill_tokens", 0.0) if "prefill_tokens" in s1 else seen.submitted - n0
        eng.close()
        return {"episodes": len(trajs), "wall_s": wall, "cpu_s": cpu, "episodes_per_s": len(trajs) / wall,
                "episodes_per_cpu_s": len(trajs) / cpu, "prompt_side": prompt_side,
                "computed": computed, "ratio": computed / max(prompt_side, 1), "compiles_timed": eng.compiles - c0,
                "compiles": eng.compiles, "success": sum(bool(t.verification and t.verification.success) for t in trajs)}

    stride = max(len(dev) // args.episodes, 1)
    tasks = dev[::stride][: args.episodes]
    # live episodes = slots, as `mpa eval` runs (rollout.batch_size is both): more live episodes than rows would
    # evict an episode's row between its turns
    cfg = EpisodeConfig.from_config(config.rollout, seed=0, greedy=True, batch_size=min(len(tasks), args.slots), planner="bench",
                                    schedule="continuous")
    out["eval"] = run(tasks, cfg, args.slots, rounds=False)
    print(f"eval done: {out['eval']}", file=sys.stderr, flush=True)
    groups = [t for t in dev[::max(len(dev) // args.tasks, 1)][: args.tasks] for _ in range(args.group)]
    cfg = EpisodeConfig.from_config(config.rollout, seed=1, temperature=1.0, top_p=1.0, top_k=-1, batch_size=len(groups),
                                    planner="bench", schedule="rounds")
    out["rl"] = run(groups, cfg, len(groups), rounds=True)
    print(f"rl done: {out['rl']}", file=sys.stderr, flush=True)
    runner.close()
    # The program mix: a small random model (what is counted is programs, which do not depend on its width).
    mcfg = models.ModelConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, max_position_embeddings=args.mix_max + 16)
    eng = Engine(mcfg, models.init_params(mcfg, jax.random.key(0)), slots=8, slot_len=args.mix_max + 8, max_batch=8,
                 replicas=args.replicas)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, args.mix_max + 1, args.mix)
    t0 = time.perf_counter()
    for lo in range(0, len(lengths), 8):
        eng.generate([rng.integers(1, mcfg.vocab_size, int(n)).tolist() for n in lengths[lo:lo + 8]],
                     SamplingParams(max_new_tokens=4, temperature=0.0))
    out["mix"] = {"compiles": eng.compiles, "wall_s": time.perf_counter() - t0, "prompts": int(len(lengths))}
    eng.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starter", default=os.path.join(ROOT, "starter"))
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--slots", type=int, default=24)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--mix", type=int, default=200)
    ap.add_argument("--mix-max", type=int, default=4000)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--security", choices=("off", "on"), default="off",
                    help="the injection defense in the episodes (off: both trees play the same episodes; a base from before "
                         "the defense has none)")
    ap.add_argument("--base-ref", default="", help="git ref of today's engine (default: where this branch left main)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("WORKER " + json.dumps(worker(args)), flush=True)
        return 0
    if not args.base_ref:
        args.base_ref = subprocess.run(["git", "-C", ROOT, "merge-base", "HEAD", "main"], check=True, capture_output=True,
                                       text=True).stdout.strip()[:12]
    base_dir = tempfile.mkdtemp(prefix="mpa_base_")
    archive = subprocess.run(["git", "-C", ROOT, "archive", args.base_ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", base_dir], input=archive, check=True)
    # setup.py maps kernels/, envs/ and harness/ into mpa_jax; the editable install maps them to THIS tree, so the
    # base side gets its own folders linked into its package (found first on its sys.path)
    for folder in ("kernels", "envs", "harness"):
        link = os.path.join(base_dir, "mpa_jax", folder)
        if os.path.isdir(os.path.join(base_dir, folder)) and not os.path.exists(link):
            os.symlink(os.path.join(base_dir, folder), link)
    results = {}
    for side, tree in (("base", base_dir), ("new", ROOT)):
        env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", ""), "JAX_PLATFORMS": "cpu"}
        argv = [sys.executable, os.path.join(ROOT, "bench", "engine_reuse.py"), "--worker"] + sys.argv[1:]
        proc = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.PIPE, text=True)  # progress on stderr
        line = [x for x in proc.stdout.splitlines() if x.startswith("WORKER ")]
        if proc.returncode or not line:
            sys.stderr.write(proc.stdout[-3000:])
            return 1
        results[side] = json.loads(line[-1][len("WORKER "):])
        r = results[side]
        print(f"{side} ({args.base_ref if side == 'base' else 'this tree'}: {r['tree']}): "
              f"eval {r['eval']['episodes']} episodes {r['eval']['episodes_per_s']:.3f}/s, prefill/prompt-side "
              f"{r['eval']['ratio']:.2f}, success {r['eval']['success']}, compiles {r['eval']['compiles']}, CPU {r['eval']['cpu_s']:.1f} s; "
              f"RL groups {r['rl']['episodes']} episodes {r['rl']['wall_s']:.1f} s (CPU {r['rl']['cpu_s']:.1f} s), "
              f"prefill/prompt-side {r['rl']['ratio']:.2f}, "
              f"compiles {r['rl']['compiles']}; mix of {r['mix']['prompts']} prompts: {r['mix']['compiles']} compiles, "
              f"{r['mix']['wall_s']:.1f} s", flush=True)
    b, n = results["base"], results["new"]
    rows = [("evaluation episodes/s", "episodes/s", n["eval"]["episodes_per_s"], b["eval"]["episodes_per_s"], "higher"),
            ("evaluation episodes per CPU second", "episodes/s", n["eval"]["episodes_per_cpu_s"], b["eval"]["episodes_per_cpu_s"], "higher"),
            ("evaluation prefill per prompt-side token", "tokens/token", n["eval"]["ratio"], b["eval"]["ratio"], "lower"),
            ("RL groups rollout wall", "s", n["rl"]["wall_s"], b["rl"]["wall_s"], "lower"),
            ("RL groups rollout CPU", "s", n["rl"]["cpu_s"], b["rl"]["cpu_s"], "lower"),
            ("RL groups prefill per prompt-side token", "tokens/token", n["rl"]["ratio"], b["rl"]["ratio"], "lower"),
            (f"compiles, {n['mix']['prompts']}-prompt mix 1..{args.mix_max}", "programs", n["mix"]["compiles"], b["mix"]["compiles"], "lower"),
            ("compiles, evaluation", "programs", n["eval"]["compiles"], b["eval"]["compiles"], "lower")]
    for fig, unit, ours, peer, direction in rows:
        print("BENCH_ROW " + json.dumps({"figure": fig, "unit": unit, "ours": round(float(ours), 4), "peer": args.base_ref,
                                         "peer_value": round(float(peer), 4), "direction": direction}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
