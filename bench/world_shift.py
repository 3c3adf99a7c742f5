"""How much of a planner's success is its training worlds? Greedy success on the same templates in the train
split's persona worlds and in worlds of no split (issue 28).

    python bench/world_shift.py --checkpoint starter --templates 80

Takes `--templates` train templates (a seeded shuffle), builds one fresh gated instance of each (instance seeds of
no split and of no RL draw) twice: in the train split's six persona worlds and in six worlds no split uses
(`envs.benchmark.FRESH_PERSONA_BASE` and up), and evaluates the checkpoint greedily, harness off, on both sets.
The dev and test splits are set in worlds of their own, so the gap between the two figures is what a planner
that learned its training worlds' people and things loses on them.

    python bench/world_shift.py --checkpoint starter --refresh-steps 150 --refresh-worlds 256

first refreshes the checkpoint by SFT (`mpa_jax.sft.world_refresh`: AdamW `--refresh-lr`, as the loop's refresh)
on oracle demonstrations of `--refresh-per-template` instances of every train template set in `--refresh-worlds`
worlds of no split (other worlds than the measured ones), then measures the refreshed checkpoint, and its greedy
success on the 144 dev tasks of `mpa experiment rl-lift` (96 of seen templates + 48 of held-out ones). The same
refresh is the first stage of `mpa experiment rl-lift` when `config.lift.refresh_steps` > 0.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_SEED_BASE = 9_500_000  # instance seeds: above the RL draws (5,000,000 + 100,000 x seed + drawn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, "starter"), help="an HF directory (default: the shipped starter)")
    ap.add_argument("--templates", type=int, default=80, help="train templates to sample (default 80)")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "rl_lift.py"))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "world_shift"))
    ap.add_argument("--refresh-steps", type=int, default=0, help="SFT the checkpoint on fresh-world demonstrations first (0: no)")
    ap.add_argument("--refresh-worlds", type=int, default=256, help="worlds of no split for the refresh (0: the train split's six)")
    ap.add_argument("--refresh-per-template", type=int, default=2)
    ap.add_argument("--refresh-lr", type=float, default=1e-4)
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from mpa_jax.config import load_config_file
    from mpa_jax.envs.benchmark import FRESH_PERSONA_BASE, PERSONAS, templates_for
    from mpa_jax.eval import Evaluator
    from mpa_jax.sft.world_refresh import fresh_instances, world_refresh

    config = load_config_file(a.config)
    ckpt = a.checkpoint
    if a.refresh_steps:
        ckpt, info = world_refresh(config, ckpt, os.path.join(a.out, "refresh"), worlds=a.refresh_worlds,
                                   per_template=a.refresh_per_template, steps=a.refresh_steps, lr=a.refresh_lr)
        print(f"refresh: {info['tasks']} tasks in {info['worlds'] or 'the train split'} worlds, {info['steps']} SFT steps at lr"
              f" {info['lr']:g}, train loss {info['train_loss']:.3f}", flush=True)
    temps = list(templates_for("train"))
    random.Random(0).shuffle(temps)
    temps = temps[: a.templates]
    fresh = tuple(range(FRESH_PERSONA_BASE, FRESH_PERSONA_BASE + len(PERSONAS["train"])))
    figures = {}
    for label, worlds in (("train worlds", PERSONAS["train"]), ("worlds of no split", fresh)):
        tasks = fresh_instances(temps, worlds, seed_base=PROBE_SEED_BASE)
        rep = Evaluator(config, tasks, progress=False).evaluate(ckpt, out_dir=os.path.join(a.out, label.replace(" ", "_")), label=label)
        o = rep["harness"]["off"]["overall"]
        figures[label] = o["success"]
        print(f"{label:<20} {len(tasks)} tasks: greedy success {100 * o['success']:.1f}%, output tokens {o['mean_output_tokens']:.1f}", flush=True)
    gap = 100 * (figures["train worlds"] - figures["worlds of no split"])
    print(f"gap: {gap:+.1f} points (train worlds - worlds of no split)")
    if a.refresh_steps:
        from mpa_jax.eval import select_tasks

        dev = select_tasks("dev", n_seen=96, n_held_out=48, seed=int(config.tasks.seed), per_template=int(config.tasks.per_template))
        m = Evaluator(config, dev, progress=False).evaluate(ckpt, out_dir=os.path.join(a.out, "dev"), label="dev")["harness"]["off"]
        g = m["by_templates"]
        print(f"dev (144 tasks): greedy success {100 * m['overall']['success']:.1f}% (seen {100 * g['seen']['success']:.1f}%, "
              f"held-out {100 * g['held_out']['success']:.1f}%), output tokens {m['overall']['mean_output_tokens']:.1f}")


if __name__ == "__main__":
    main()
