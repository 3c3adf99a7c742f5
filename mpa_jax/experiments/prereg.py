"""`mpa experiment prereg`: the pre-registered RL and CARE experiment (issue 53 item 2; configs/prereg_rl.py).

    run_arms(config, workdir)            # every arm of config.prereg.arms without a record, in order (resumes)
    write_table(config)                  # table.md + prereg_rl.png from whatever records exist

An arm is RL from a start (`rl.algo`, seed, beta, failure_cost as the config lists them) for `rl.steps` steps, then
one greedy, harness-off evaluation of its export on the pre-registered test set; an arm of algo "none" is its start
evaluated alone. Runs live in `workdir` (checkpoints every step: a killed run resumes from its last step with the
same command); a finished arm writes one small **record** into `config.prereg.results`, a directory committed to
git: `<arm>.json` (the arm, the frozen config's hash, the commit, per-task outcomes, RL wall time) and
`<arm>.metrics.jsonl` (its RL step metrics). An arm whose record exists is skipped, so the experiment completes
across machines that keep only git. No checkpoints are recorded.

The table pairs by task: success (mean and spread over seeds), seen / held-out templates, output tokens per success
and per failure apart, paired task counts (tasks one policy solves and the other does not), and the
pre-registered targets' verdicts (docs/preregistered.md).
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import subprocess
from typing import Any, Sequence

import numpy as np

from mpa_jax.files import write_text

RL_ALGOS = ("care", "vanilla")


# ---------------------------------------------------------------------------------------------- records

# The sections that define the experiment (the recipe, the model, what a rollout and an evaluation are, the refresh
# start, the arms). The loop's, demo's, harness's and serving's settings are not part of it (harness off here).
HASHED_SECTIONS = ("seed", "rl", "model", "context", "tasks", "envs", "eval", "rollout", "sft", "oracle", "tokenizer", "lift", "security", "prereg")
# Engine implementation settings: how the same rollouts are computed, not which (docs/perf.md)
ENGINE_KEYS = ("schedule", "sharded", "replicas", "batch_size", "prefill_step", "prefill_row_base", "prefill_chunk", "prefix_cache",
               "compilation_cache")


# Keys added to a hashed section after the registration, at the value that leaves the experiment as registered
# (a new option that is off): they are left out of the hash at that value, so an added option is no change, while
# turning it on is (the same rule as a task's new optional field: docs/preregistered.md).
NEUTRAL_ADDITIONS: dict[tuple[str, ...], Any] = {
    ("envs", "agentdojo", "attack"): "",  # AgentDojo attacked pairs drawable by RL (issue 52), off
    ("envs", "agentdojo", "injection_tasks"): 0,
    ("rollout", "compute_dtype"): "",  # the engine's own compute dtype (2026-12-08); "" = the model's, as registered
}


def config_hash(config: Any) -> str:
    """sha256 (16 hex) of the experiment-defining sections of the config (`HASHED_SECTIONS`, without `prereg.results`,
    the rollout engine's implementation keys and `NEUTRAL_ADDITIONS` at their neutral value): records of one frozen
    experiment share it."""
    d = json.loads(config.to_json_best_effort(sort_keys=True))
    for path, neutral in NEUTRAL_ADDITIONS.items():
        parent = d
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent and parent[path[-1]] == neutral:
            del parent[path[-1]]
    kept = {k: d[k] for k in HASHED_SECTIONS if k in d}
    kept["prereg"] = {k: v for k, v in kept.get("prereg", {}).items() if k != "results"}
    kept["rollout"] = {k: v for k, v in kept.get("rollout", {}).items() if k not in ENGINE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def results_dir(config: Any) -> str:
    """`config.prereg.results`, relative to the repository root unless absolute."""
    from mpa_jax.start import repo_root

    if "prereg" not in config:
        raise ValueError(f"config {config.name!r} has no prereg section: use configs/prereg_rl.py")
    path = str(config.prereg.results)
    return path if os.path.isabs(path) else os.path.join(repo_root(), path)


def record_path(results: str, arm: str) -> str:
    return os.path.join(results, f"{arm}.json")


def read_records(results: str) -> dict[str, dict[str, Any]]:
    """Every finished arm's record in `results`, by arm name."""
    out: dict[str, dict[str, Any]] = {}
    if not os.path.isdir(results):
        return out
    for f in sorted(os.listdir(results)):
        if f.endswith(".json") and not f.startswith("summary"):
            with open(os.path.join(results, f), encoding="utf-8") as fh:
                rec = json.load(fh)
            out[rec["arm"]["name"]] = rec
    return out


def task_outcomes(trajs: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Per task id: success (None for an infra failure), output tokens, tool calls, template group."""
    from mpa_jax.eval.tasks import template_group

    out = {}
    for t in trajs:
        infra = bool(t.infra_failure or t.verification is None or t.verification.infra_error)
        out[t.task_id] = {"success": None if infra else bool(t.verification.success),
                          "output_tokens": int(t.costs.get("output_tokens", 0)), "tool_calls": int(t.costs.get("tool_calls", 0)),
                          "group": template_group(str(t.provenance.get("template", "")))}
    return out


def _commit() -> str:
    from mpa_jax.start import repo_root

    try:
        return subprocess.run(["git", "-C", repo_root(), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _write_json(path: str, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------- running

class ArmInterrupted(RuntimeError):
    """An arm's RL run was stopped (SIGINT/SIGTERM) before its last step: it has no record and resumes next time."""


def arm_config(config: Any, arm: dict[str, Any]) -> Any:
    """The RL config of one arm: `rl.algo`, the seed, `rl.beta` and `rl.failure_cost` change, nothing else (the
    vanilla arm keeps the lambda schedule: the matched-arms rule keeps a group by CARE's reward or vanilla's)."""
    if arm["algo"] not in RL_ALGOS:
        raise ValueError(f"prereg arm {arm['name']!r}: algo {arm['algo']!r} is not an RL algorithm ({', '.join(RL_ALGOS)})")
    cfg = copy.deepcopy(config)
    cfg.rl.algo, cfg.seed = str(arm["algo"]), int(arm["seed"])
    cfg.rl.beta, cfg.rl.failure_cost = float(arm["beta"]), float(arm["failure_cost"])
    return cfg


def evaluate_on_test_set(config: Any, checkpoint: str, *, out_dir: str, label: str, workdir: str,
                         progress: bool = True) -> tuple[dict[str, Any], list[Any]]:
    """Greedy, harness off, on `config.prereg.eval_tasks` of the pre-registered list (0: all, in list order): the
    experiment's only reader of the list, and only to evaluate. Returns the report and the trajectories."""
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.eval import Evaluator
    from mpa_jax.eval.tasks import PREREGISTERED, evaluation_tasks

    tasks = evaluation_tasks(PREREGISTERED, n=int(config.prereg.eval_tasks))
    rep = Evaluator(config, tasks, progress=progress).evaluate(checkpoint, out_dir=out_dir, harness="off", k=1, label=label,
                                                               workdir=workdir)
    return rep, read_jsonl(os.path.join(out_dir, "off", "run0.jsonl"), Trajectory)


def _start_dir(config: Any, workdir: str, start: str, progress: bool) -> tuple[str, dict[str, Any] | None]:
    """The HF directory of a start: the shipped starter, or its world refresh (made once into <workdir>/refresh)."""
    from mpa_jax.start import repo_root

    starter = str(config.prereg.starter)
    starter = starter if os.path.isabs(starter) else os.path.join(repo_root(), starter)
    if start == "starter":
        return starter, None
    if start == "refresh":
        from mpa_jax.sft.world_refresh import world_refresh

        p = config.prereg
        return world_refresh(config, starter, os.path.join(workdir, "refresh"), worlds=int(p.refresh_worlds),
                             per_template=int(p.refresh_per_template), steps=int(p.refresh_steps), lr=float(p.refresh_lr),
                             progress=progress)
    raise ValueError(f"prereg: unknown start {start!r} (starter, refresh)")


def run_arm(config: Any, arm: dict[str, Any], workdir: str, results: str, progress: bool = True) -> dict[str, Any]:
    """Run one arm to its end (resuming), evaluate it and write its record; returns the record."""
    import time

    from mpa_jax.export import export_checkpoint
    from mpa_jax.rl.trainer import run_rl
    from mpa_jax.train.metrics import read_metrics

    name = str(arm["name"])
    run_dir = os.path.join(workdir, name)
    init, refresh = _start_dir(config, workdir, str(arm["start"]), progress)
    rl: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = []
    checkpoint = init
    if arm["algo"] != "none":
        cfg = arm_config(config, arm)
        t0 = time.perf_counter()
        res = run_rl(cfg, run_dir, init=init, progress=progress)
        if res.interrupted or int(res.steps) < int(cfg.rl.steps):  # stopped by a signal: no record, resume later
            raise ArmInterrupted(f"prereg: {name}: " + (res.interrupted or f"stopped at step {res.steps}; run the same command "
                                                        "again to resume it"))
        checkpoint = export_checkpoint(res.checkpoint_dir, os.path.join(run_dir, "hf"), dtype="float32", tokenizer_dir=init)
        metrics = [r for _, r in sorted({int(r["step"]): r for r in read_metrics(res.metrics_path)}.items())]
        rl = {"steps": int(res.steps), "wall_s_last_session": time.perf_counter() - t0, "resumed_from": res.resumed_from,
              "episodes": sum(float(r.get("rl/rollouts", 0.0)) for r in metrics)}
    t0 = time.perf_counter()
    rep, trajs = evaluate_on_test_set(config, checkpoint, out_dir=os.path.join(run_dir, "eval"), label=name, workdir=workdir,
                                      progress=progress)
    record = {"arm": dict(arm), "config": str(config.name), "config_hash": config_hash(config), "commit": _commit(),
              "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "eval": {"tasks": len(trajs), "weight_version": rep.get("weight_version"), "wall_s": time.perf_counter() - t0},
              "rl": rl, "refresh": {k: v for k, v in (refresh or {}).items() if isinstance(v, (int, float, str))} or None,
              "summary": summarise(task_outcomes(trajs)), "tasks": task_outcomes(trajs)}
    if metrics:
        write_text(os.path.join(results, f"{name}.metrics.jsonl"), "".join(json.dumps(r, sort_keys=True) + "\n" for r in metrics))
    _write_json(record_path(results, name), record)  # last: its existence means the arm is done
    return record


def run_arms(config: Any, workdir: str, *, results: str | None = None, only: Sequence[str] = (), progress: bool = True,
             log: Any = print) -> list[str]:
    """Run every arm of `config.prereg.arms` (or those named in `only`) that has no record yet, in the listed order;
    returns the names of the arms run now. Then regenerates the table."""
    results = results or results_dir(config)
    names = [str(a["name"]) for a in config.prereg.arms]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"prereg: unknown arm(s) {unknown}; the config lists {names}")
    os.makedirs(results, exist_ok=True)
    ran = []
    for arm in config.prereg.arms:
        name = str(arm["name"])
        if only and name not in only:
            continue
        if os.path.exists(record_path(results, name)):
            log(f"prereg: {name}: recorded, skipped ({record_path(results, name)})")
            continue
        log(f"prereg: {name}: running")
        try:
            run_arm(config, dict(arm), os.path.abspath(workdir), results, progress=progress)
        except ArmInterrupted as e:
            log(str(e))
            break
        ran.append(name)
        write_table(config, results)
    return ran


# ---------------------------------------------------------------------------------------------- the table

def summarise(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Success overall / seen / held-out and output tokens (all, per success, per failure) of per-task outcomes."""
    scored = {k: v for k, v in tasks.items() if v["success"] is not None}

    def rate(group: str | None) -> float | None:
        xs = [v["success"] for v in scored.values() if group is None or v["group"] == group]
        return float(np.mean(xs)) if xs else None

    def tok(pred: Any) -> float | None:
        xs = [v["output_tokens"] for v in scored.values() if pred(v)]
        return float(np.mean(xs)) if xs else None

    return {"tasks": len(tasks), "infra_failures": len(tasks) - len(scored), "success": rate(None), "success_seen": rate("seen"),
            "success_held_out": rate("held_out"), "successes": int(sum(v["success"] for v in scored.values())),
            "output_tokens": tok(lambda v: True), "output_tokens_success": tok(lambda v: v["success"]),
            "output_tokens_failure": tok(lambda v: not v["success"]),
            "tool_calls": float(np.mean([v["tool_calls"] for v in scored.values()])) if scored else None}


def paired(a: dict[str, Any], b: dict[str, Any], group: str | None = None) -> tuple[int, int]:
    """(tasks `a` solves and `b` does not, tasks `b` solves and `a` does not) over the tasks both scored."""
    ta, tb = a["tasks"], b["tasks"]
    both = [k for k in ta if k in tb and ta[k]["success"] is not None and tb[k]["success"] is not None
            and (group is None or ta[k]["group"] == group)]
    return (sum(ta[k]["success"] and not tb[k]["success"] for k in both), sum(tb[k]["success"] and not ta[k]["success"] for k in both))


def _group(arm: dict[str, Any]) -> str:
    """An arm's name without its seed ("care-s1" -> "care")."""
    name = str(arm["name"])
    return name.rsplit("-s", 1)[0] if arm["algo"] != "none" else name


def _start_record(records: dict[str, dict[str, Any]], arm: dict[str, Any]) -> dict[str, Any] | None:
    """The record of the arm's start evaluated alone (arm "start" for the starter, "refresh" for the refresh)."""
    return records.get("start" if arm["start"] == "starter" else str(arm["start"]))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{100 * np.mean(xs):.1f}%" + (f" ± {100 * np.std(xs, ddof=1):.1f}" if len(xs) > 1 else "")


def _md(headers: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def _m(recs: list[dict[str, Any]], key: str) -> float | None:
    xs = [r["summary"][key] for r in recs if r["summary"][key] is not None]
    return float(np.mean(xs)) if xs else None


def verdicts(config: Any, records: dict[str, dict[str, Any]]) -> list[str]:
    """The pre-registered targets, judged on what exists (provisional while seeds are missing)."""
    arms = {str(a["name"]): a for a in config.prereg.arms}
    out = []
    # CARE vs vanilla from the starter, paired by seed
    seeds = sorted({int(a["seed"]) for a in arms.values() if _group(a) in ("care", "vanilla")})
    pairs = [(records[f"care-s{s}"], records[f"vanilla-s{s}"]) for s in seeds if f"care-s{s}" in records and f"vanilla-s{s}" in records]
    if pairs:
        care, van = [p[0] for p in pairs], [p[1] for p in pairs]
        d = 100 * (_m(care, "success") - _m(van, "success"))
        cut = 1 - _m(care, "output_tokens") / _m(van, "output_tokens")
        won = [paired(c, v) for c, v in pairs]
        ok = d >= -2 and cut >= 0.25
        ts, tf = _m(care, "output_tokens_success"), _m(van, "output_tokens_success")
        fs, ff = _m(care, "output_tokens_failure"), _m(van, "output_tokens_failure")
        status = "met" if ok else "not met"
        if len(pairs) < len(seeds):
            status += f" (provisional: {len(pairs)} of {len(seeds)} seeds)"
        out.append(f"CARE vs vanilla (starter, seeds {[int(c['arm']['seed']) for c in care]}): success {d:+.1f} points "
                   f"(paired tasks CARE-only / vanilla-only {sum(w[0] for w in won)} / {sum(w[1] for w in won)}), output tokens "
                   f"{-100 * cut:+.1f}% (successes {_num(ts)} vs {_num(tf)}, failures {_num(fs)} vs {_num(ff)}); target "
                   f"(>= -2 points and <= -25% tokens): {status}")
    else:
        out.append("CARE vs vanilla: pending (no seed has both arms recorded)")
    # RL vs its start on held-out templates
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, a in arms.items():
        if a["algo"] != "none" and name in records:
            groups.setdefault(_group(a), []).append(records[name])
    for g, recs in groups.items():
        start = _start_record(records, recs[0]["arm"])
        if start is None:
            out.append(f"{g}: RL vs its start pending (start {recs[0]['arm']['start']} not evaluated yet)")
            continue
        if _m(recs, "success_held_out") is None or start["summary"]["success_held_out"] is None:
            out.append(f"{g}: no held-out-template task evaluated")
            continue
        held = 100 * (_m(recs, "success_held_out") - start["summary"]["success_held_out"])
        alls = 100 * (_m(recs, "success") - start["summary"]["success"])
        won = [paired(r, start, "held_out") for r in recs]
        out.append(f"{g} vs its start ({recs[0]['arm']['start']}, {len(recs)} seed{'s' if len(recs) > 1 else ''}): held-out templates "
                   f"{held:+.1f} points (paired held-out tasks gained / lost {sum(w[0] for w in won)} / {sum(w[1] for w in won)}), all "
                   f"{alls:+.1f}; target (>= +8 held-out): {'met' if held >= 8 else 'not met'}")
    missing = [n for n in arms if n not in records]
    if missing:
        out.append(f"not yet recorded: {', '.join(missing)}")
    stale = sorted(n for n, r in records.items() if r.get("config_hash") != config_hash(config))
    if stale:
        out.append(f"WARNING: records of another config than the frozen one: {', '.join(stale)}")
    return out


def table(config: Any, records: dict[str, dict[str, Any]]) -> str:
    """Per record, per arm group (mean and spread over seeds) and the verdicts, as markdown."""
    arms = [dict(a) for a in config.prereg.arms]
    rows = []
    for a in arms:
        r = records.get(str(a["name"]))
        if r is None:
            continue
        s, start = r["summary"], _start_record(records, a)
        vs = "-" if a["algo"] == "none" or start is None else "{} / {}".format(*paired(r, start))
        rows.append([a["name"], a["start"], a["algo"], a["seed"] if a["algo"] != "none" else "-", (r["rl"] or {}).get("steps", 0),
                     f"{_pct(s['success'])} ({s['successes']})", _pct(s["success_seen"]), _pct(s["success_held_out"]),
                     _num(s["output_tokens"]), _num(s["output_tokens_success"]), _num(s["output_tokens_failure"]), vs, s["infra_failures"]])
    per_record = _md(["arm", "start", "algo", "seed", "RL steps", f"all ({_n_tasks(records)})", "seen", "held-out", "output tokens",
                      "tokens / success", "tokens / failure", "tasks gained / lost vs start", "infra"], rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for a in arms:
        if str(a["name"]) in records:
            groups.setdefault(_group(a), []).append(records[str(a["name"])])
    grows = [[g, len(recs), _mean_sd([r["summary"]["success"] for r in recs]), _mean_sd([r["summary"]["success_seen"] for r in recs]),
              _mean_sd([r["summary"]["success_held_out"] for r in recs]), _num(_m(recs, "output_tokens")),
              _num(_m(recs, "output_tokens_success")), _num(_m(recs, "output_tokens_failure"))] for g, recs in groups.items()]
    per_group = _md(["arm", "seeds", "success (mean ± sd over seeds)", "seen", "held-out", "output tokens", "tokens / success",
                     "tokens / failure"], grows)
    return "\n".join([per_group, "", per_record, ""] + [f"- {v}" for v in verdicts(config, records)])


def _n_tasks(records: dict[str, dict[str, Any]]) -> int:
    return max((r["summary"]["tasks"] for r in records.values()), default=0)


def plot(config: Any, records: dict[str, dict[str, Any]], path: str) -> str:
    """Success (all and held-out templates) and output tokens per success / per failure, per arm group: each seed
    a dot, the seed mean a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for a in config.prereg.arms:
        if str(a["name"]) in records:
            groups.setdefault(_group(a), []).append(records[str(a["name"])])
    names = list(groups)
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 1.4 * len(names) + 4), 4.5))
    for ax, keys, title, scale in ((axes[0], ("success", "success_held_out"), "greedy success on the pre-registered test set", 100),
                                   (axes[1], ("output_tokens_success", "output_tokens_failure"), "output tokens per success / failure", 1)):
        for j, key in enumerate(keys):
            means = [scale * (_m(groups[g], key) or 0.0) for g in names]
            off = (j - 0.5) * 0.38
            ax.bar(x + off, means, width=0.36, alpha=0.6, label=key.replace("_", " "))
            for i, g in enumerate(names):
                ys = [scale * r["summary"][key] for r in groups[g] if r["summary"][key] is not None]
                ax.plot([x[i] + off] * len(ys), ys, "k.", markersize=5)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_table(config: Any, results: str | None = None) -> dict[str, str]:
    """`<results>/table.md` and `<results>/prereg_rl.png` from the records there; returns their paths and the table."""
    results = results or results_dir(config)
    records = read_records(results)
    text = table(config, records)
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    png = plot(config, records, os.path.join(results, "prereg_rl.png")) if records else ""
    return {"table": text, "table_md": os.path.join(results, "table.md"), "png": png}
