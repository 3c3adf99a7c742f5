"""Does RL that concentrates on a few templates fix them, and does it reach the dev tasks? (issue 28)

    python bench/rl_pool_transfer.py --run runs/rl_lift_pool/care-s0 --step 60 --fresh 4

Reads an RL-lift arm trained with a focus pool (`rl.select_pool`): the templates that have been in the pool
by `--step` (its `competence.jsonl`), and the greedy dev evaluations of the experiment's start and of the
arm at that step (`<workdir>/eval/start`, `<run>/eval/step_N`). Prints dev success of the 144 tasks split
three ways: tasks of pooled templates, of the other seen templates, of held-out templates (start vs step,
tasks gained and lost). With `--fresh K` it also evaluates, greedily and harness off, K fresh instances of
every pooled template (instance seeds of no split and of no RL draw) with the start and with the arm's
step-N export: whether the pool's own templates were learned, apart from whether that reached the dev set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_SEED_BASE = 9_000_000  # fresh probe instances: above the RL draws (5,000,000 + 100,000 x seed + drawn)


def pooled_templates(run: str, step: int) -> dict[str, int]:
    """Template -> its training episodes by `step`, for every template in the focus pool by then."""
    with open(os.path.join(run, "competence.jsonl"), encoding="utf-8") as f:
        rows = [r for r in (json.loads(ln) for ln in f if ln.strip()) if r["step"] <= step]
    if not rows or "pool" not in rows[-1]:
        raise SystemExit(f"{run}/competence.jsonl has no focus pool up to step {step} (rl.select_pool = 0?)")
    names = {n for r in rows for n in list(r["pool"]) + r["retired"]}
    return {n: rows[-1]["templates"].get(n, [0, 0, 0])[1] for n in sorted(names)}


def _outcomes(path: str) -> dict[str, tuple[str, bool]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for ln in f:
            t = json.loads(ln)
            out[t["task_id"]] = (t["provenance"]["template"], bool(t["verification"] and t["verification"]["success"]))
    return out


def dev_split(start: dict[str, tuple[str, bool]], after: dict[str, tuple[str, bool]], pooled: set[str],
              held_out: set[str]) -> dict[str, dict[str, int]]:
    """Per part (pooled / other seen / held-out): tasks, successes at the start and after, gained, lost."""
    parts: dict[str, dict[str, int]] = {p: dict(tasks=0, start=0, after=0, gained=0, lost=0) for p in ("pooled", "other seen", "held-out")}
    for tid, (tmpl, ok0) in start.items():
        ok1 = after[tid][1]
        p = parts["held-out" if tmpl in held_out else "pooled" if tmpl in pooled else "other seen"]
        p["tasks"] += 1
        p["start"] += ok0
        p["after"] += ok1
        p["gained"] += ok1 and not ok0
        p["lost"] += ok0 and not ok1
    return parts


def fresh_probe(config: Any, templates: list[str], k: int, checkpoints: dict[str, str], out: str) -> dict[str, float]:
    """Greedy success of each checkpoint on K fresh instances of every template."""
    from mpa_jax.envs.benchmark import build_task, templates_for
    from mpa_jax.envs.gate import check_task
    from mpa_jax.envs.sandbox import SandboxEnv
    from mpa_jax.eval import Evaluator

    by_name = {t.name: t for t in templates_for("train")}
    env, tasks, inst = SandboxEnv(), [], PROBE_SEED_BASE
    try:
        for name in templates:
            got = 0
            while got < k and inst < PROBE_SEED_BASE + 50 * k * len(templates):
                task = build_task(by_name[name], "train", inst)
                inst += 1
                if task is not None and check_task(task, env) is None:
                    tasks.append(task)
                    got += 1
    finally:
        env.close()
    ev = Evaluator(config, tasks, progress=False)
    res = {}
    for label, ckpt in checkpoints.items():
        rep = ev.evaluate(ckpt, out_dir=os.path.join(out, label), label=label)
        res[label] = float(rep["harness"]["off"]["overall"]["success"])
    res["tasks"] = float(len(tasks))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="an RL-lift arm trained with rl.select_pool > 0 (<workdir>/<algo>-s<seed>)")
    ap.add_argument("--step", type=int, required=True, help="an evaluated step of the arm")
    ap.add_argument("--start", default="", help="the start's dev trajectories (default <workdir>/eval/start/off/run0.jsonl)")
    ap.add_argument("--fresh", type=int, default=0, help="fresh instances per pooled template to evaluate (0: dev split only)")
    ap.add_argument("--init", default=os.path.join(ROOT, "starter"), help="the start's HF directory (for --fresh)")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "rl_lift.py"))
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from mpa_jax.eval import held_out_templates

    run = a.run.rstrip("/")
    start_path = a.start or os.path.join(os.path.dirname(run), "eval", "start", "off", "run0.jsonl")
    pooled = pooled_templates(run, a.step)
    parts = dev_split(_outcomes(start_path), _outcomes(os.path.join(run, "eval", f"step_{a.step}", "off", "run0.jsonl")),
                      set(pooled), held_out_templates())
    eps = sorted(pooled.values())
    print(f"{len(pooled)} templates pooled by step {a.step}: {sum(eps)} training episodes, per template median {eps[len(eps) // 2]}, max {eps[-1]}")
    print("| dev tasks | tasks | start | step %d | gained | lost |" % a.step)
    print("|---|---|---|---|---|---|")
    for name, p in parts.items():
        if p["tasks"]:
            print(f"| {name} | {p['tasks']} | {100 * p['start'] / p['tasks']:.1f}% | {100 * p['after'] / p['tasks']:.1f}% | {p['gained']} | {p['lost']} |")
    if a.fresh:
        from mpa_jax.config import load_config_file

        config = load_config_file(a.config)
        ckpts = {"start": a.init, f"step_{a.step}": os.path.join(run, "hf", f"step_{a.step}")}
        res = fresh_probe(config, sorted(pooled), a.fresh, ckpts, os.path.join(run, "pool_probe", f"step_{a.step}"))
        print(f"fresh instances of the pooled templates ({int(res['tasks'])} tasks, greedy, harness off): "
              + ", ".join(f"{k} {100 * v:.1f}%" for k, v in res.items() if k != "tasks"))


if __name__ == "__main__":
    main()
