"""`mpa experiment coevolution`: co-evolution against model-only (issue 53 item 3; configs/prereg_coevo.py).

    run_arms(config, workdir)     # both arms (resumes), then one record per arm into config.coevolution.results
    write_table(config)           # the per-round table from the records

Both arms are the closed loop (`mpa_jax.loop.Loop`) from the same start (`config.coevolution.starter`: the shipped
starter, or '' = from scratch), with the same config, seeds and budget (`loop.rounds` rounds of RL + SFT refresh +
data), evaluated every round on the same tasks (`loop.eval_split`: the pre-registered test set, read by the loop's
evaluation stage only). They differ in one stage:
- **coevolution**: the loop as it is: each round mines the training side's failures into harness proposals,
  reviews them and releases a version (behind the release gate); the next round's evaluation runs under it.
- **model-only**: the same loop with the harness stage replaced by a skip: the harness stays at its initial version
  (no released rule; the loop then evaluates harness off), so every round is RL + refresh + data alone.

In this loop no training stage reads the released harness (RL, the refresh and the data stage roll out without
it), so the two arms train the same weights given the same seeds; the record keeps a digest of each evaluated
export so the table shows whether they did. A finished arm writes `<arm>.json` (per round: success
overall / seen / held-out, output tokens, harness version, per-task outcomes) into `config.coevolution.results`
(committed; an arm with a record is skipped).
"""
from __future__ import annotations

import datetime
import json
import os
from typing import Any, Sequence

import numpy as np

from mpa_jax.files import write_text
from mpa_jax.loop import Loop

ARMS = ("model-only", "coevolution")


class ModelOnlyLoop(Loop):
    """The closed loop with the harness fixed at its initial version: the harness stage mines and releases nothing."""

    def harness(self, round_index: int, eval_result: dict[str, Any], data_result: dict[str, Any] | None,
                rollouts_dir: str = "") -> dict[str, Any]:
        return {"version": "none", "version_dir": "", "changes": [], "failures": 0, "clusters": [],
                "skipped": "model-only arm: the harness stays at its initial version (no mining, no release)"}


def arm_loop(config: Any, arm: str, workdir: str, *, progress: bool = True, console: Any = None) -> Loop:
    """The loop of one arm in `<workdir>/<arm>`, from `config.coevolution.starter` (fitted as `mpa loop --starter`)."""
    if arm not in ARMS:
        raise ValueError(f"coevolution: unknown arm {arm!r} ({', '.join(ARMS)})")
    starter = str(config.coevolution.starter)
    if starter:
        from mpa_jax.sft.starter import find_starter, load_starter, with_starter

        path = find_starter(starter)
        if path is None:
            raise ValueError(f"config.coevolution.starter={starter!r}: no starter planner there")
        config = with_starter(config, load_starter(path))
    cls = ModelOnlyLoop if arm == "model-only" else Loop
    return cls(config, os.path.join(workdir, arm), progress=progress, console=console)


def _outcomes(eval_json: str, mode: str) -> dict[str, dict[str, Any]]:
    """Per-task outcomes of one loop evaluation in `mode` ("on" / "off")."""
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.experiments.prereg import task_outcomes

    path = os.path.join(os.path.dirname(eval_json), mode, "run0.jsonl")
    return task_outcomes(read_jsonl(path, Trajectory)) if os.path.exists(path) else {}


def weights_digest(checkpoint: str | None) -> str:
    """sha256 (16 hex) of a checkpoint directory's safetensors files ("" for none): whether two arms' stages
    evaluated the same weights (the export directories' names are the same in both arms, so the engine's
    weight_version cannot tell)."""
    import hashlib

    if not checkpoint or not os.path.isdir(checkpoint):
        return ""
    h = hashlib.sha256()
    for f in sorted(os.listdir(checkpoint)):
        if f.endswith(".safetensors"):
            with open(os.path.join(checkpoint, f), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:16]


def arm_record(arm: str, summary: dict[str, Any], config: Any) -> dict[str, Any]:
    """One arm's record from its loop summary: per evaluated stage the headline figures and per-task outcomes."""
    from mpa_jax.experiments.prereg import _commit, summarise

    rounds = []
    for st in summary["stages"]:
        tasks = _outcomes(st["eval_json"], st.get("harness_mode", "off"))
        off = _outcomes(st["eval_json"], "off") if st.get("harness_mode") == "on" else tasks
        with open(st["eval_json"], encoding="utf-8") as f:
            checkpoint = json.load(f).get("checkpoint")
        rounds.append({"stage": st["name"], "harness_version": st["harness_version"], "harness_mode": st.get("harness_mode", "off"),
                       "weights": weights_digest(checkpoint), "summary": summarise(tasks) if tasks else None,
                       "summary_harness_off": summarise(off) if off else None, "tasks": tasks})
    return {"arm": arm, "config": str(config.name), "commit": _commit(), "split": summary["split"], "eval_tasks": summary["heldout_tasks"],
            "rounds_configured": int(config.loop.rounds), "seed": int(config.seed), "starter": str(config.coevolution.starter),
            "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "harness": summary["harness"], "skipped": summary["skipped"], "stages": rounds}


def results_dir(config: Any) -> str:
    """`config.coevolution.results`, relative to the repository root unless absolute."""
    from mpa_jax.start import repo_root

    if "coevolution" not in config:
        raise ValueError(f"config {config.name!r} has no coevolution section: use configs/prereg_coevo.py")
    path = str(config.coevolution.results)
    return path if os.path.isabs(path) else os.path.join(repo_root(), path)


def run_arms(config: Any, workdir: str, *, results: str | None = None, only: Sequence[str] = (), progress: bool = True,
             console: Any = None) -> list[str]:
    """Run (or continue) each arm without a record, model-only first; write its record; returns the arms run now."""
    results = results or results_dir(config)
    if "coevolution" not in config:
        raise ValueError(f"config {config.name!r} has no coevolution section: use configs/prereg_coevo.py")
    bad = [a for a in only if a not in ARMS]
    if bad:
        raise ValueError(f"coevolution: unknown arm(s) {bad} ({', '.join(ARMS)})")
    os.makedirs(results, exist_ok=True)
    ran = []
    for arm in ARMS:
        path = os.path.join(results, f"{arm}.json")
        if (only and arm not in only) or os.path.exists(path):
            continue
        summary = arm_loop(config, arm, os.path.abspath(workdir), progress=progress, console=console).run()
        rec = arm_record(arm, summary, config)
        write_text(path, json.dumps(rec, indent=1, sort_keys=True) + "\n")
        ran.append(arm)
    write_table(config, results)
    return ran


def _read(results: str) -> dict[str, dict[str, Any]]:
    out = {}
    for arm in ARMS:
        p = os.path.join(results, f"{arm}.json")
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                out[arm] = json.load(f)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def rows(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluated stage present in both arms: both arms' success, the difference and the paired task counts."""
    from mpa_jax.experiments.prereg import paired

    if set(records) != set(ARMS):
        return []
    mo = {s["stage"]: s for s in records["model-only"]["stages"]}
    out = []
    for s in records["coevolution"]["stages"]:
        m = mo.get(s["stage"])
        if m is None or not s["summary"] or not m["summary"]:
            continue
        gained, lost = paired({"tasks": s["tasks"]}, {"tasks": m["tasks"]})
        off = s["summary_harness_off"] or s["summary"]
        out.append({"stage": s["stage"], "harness_version": s["harness_version"], "model_only": m["summary"]["success"],
                    "coevolution": s["summary"]["success"], "coevolution_harness_off": off["success"],
                    "difference": s["summary"]["success"] - m["summary"]["success"], "gained": gained, "lost": lost,
                    "same_weights": bool(s["weights"]) and s["weights"] == m["weights"],
                    "held_out": (s["summary"]["success_held_out"], m["summary"]["success_held_out"]),
                    "tokens": (s["summary"]["output_tokens"], m["summary"]["output_tokens"])})
    return out


def table(records: dict[str, dict[str, Any]]) -> str:
    """The per-round markdown table (co-evolution minus model-only)."""
    rs = rows(records)
    if not rs:
        return f"co-evolution vs model-only: pending (recorded arms: {', '.join(records) or 'none'})"
    rec = records["coevolution"]
    head = (f"{rec['eval_tasks']} tasks of split {rec['split']!r}, config {rec['config']}, seed {rec['seed']}, "
            f"start {rec['starter'] or 'scratch'}")
    lines = [head, "", "| stage | harness (co-evolution) | model-only | co-evolution | difference | tasks gained / lost | "
             "co-evolution harness off | held-out (co-evo / model-only) | output tokens (co-evo / model-only) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['stage']} | {r['harness_version']} | {_pct(r['model_only'])} | {_pct(r['coevolution'])} | "
                     f"{100 * r['difference']:+.1f} | {r['gained']} / {r['lost']} | {_pct(r['coevolution_harness_off'])} | "
                     f"{_pct(r['held_out'][0])} / {_pct(r['held_out'][1])} | {r['tokens'][0]:.1f} / {r['tokens'][1]:.1f} |")
    diffs = [r["difference"] for r in rs if r["stage"].startswith("round")]
    if diffs:
        lines += ["", f"- mean difference over rounds: {100 * np.mean(diffs):+.1f} points; rounds whose evaluated weights were the "
                      f"same in both arms (sha256 of the export): {sum(r['same_weights'] for r in rs if r['stage'].startswith('round'))}"
                      f" of {len(diffs)}"]
    return "\n".join(lines)


def write_table(config: Any, results: str | None = None) -> dict[str, str]:
    """`<results>/table.md` from the records there (no plot: the table is per round)."""
    results = results or results_dir(config)
    text = table(_read(results))
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return {"table": text, "table_md": os.path.join(results, "table.md"), "png": "-"}
