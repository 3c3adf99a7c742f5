"""What one RL step logs: `metrics.jsonl`'s `rl/*` and `time/*` record, the console line, and the competence
table's line in `competence.jsonl`. No jax.

Per step, besides success / cost / update statistics: lambda over the step's groups (`rl/lambda_min`,
`rl/lambda` (the mean), `rl/lambda_max`), the competence over them (`rl/competence`), the share of groups whose
key had an estimate of its own (`rl/own_key_share`; the others are their cell's value), and the table's size
(`rl/competence_keys`, `rl/competence_cells`). `competence.jsonl` gets the step's groups (key, cell, c_k, lambda,
own) and the whole table: a schedule that never moves shows there (DESIGN §6.1).
"""
from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from mpa_jax.files import write_text
from mpa_jax.rl import care as maths
from mpa_jax.rl.advantage import Scored
from mpa_jax.rl.competence import CompetenceTable
from mpa_jax.rl.rollouts import Rollouts

if TYPE_CHECKING:  # the learner imports jax; this module does not
    from mpa_jax.rl.learner import UpdateReport


def _mean(xs: Any) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def step_metrics(rollouts: Rollouts, scored: Scored, report: "UpdateReport", table: CompetenceTable, *, version: int,
                 times: dict[str, float]) -> dict[str, float]:
    """The step's metric record (module docstring); `version`: the weight version after the step."""
    good = [u for u in report.updates if not u.get("nonfinite", 0.0)]
    first = report.updates[0] if report.updates else {}
    adv, groups = scored.advantages, np.asarray(rollouts.groups)
    zero_var = maths.zero_variance_groups(groups, adv) + (len(rollouts.draws) - len(set(rollouts.groups)))
    drawn = rollouts.drawn or len(rollouts.draws)
    lam_g = [g["lambda"] for g in scored.groups]

    def upd(k: str) -> float:
        return _mean([u[k] for u in good if k in u])

    m = {
        "rl/success": _mean(scored.success.astype(float)),
        "rl/score": _mean(scored.score),
        "rl/output_tokens": _mean(scored.output_tokens),
        "rl/tool_calls": _mean(scored.tool_calls),
        "rl/competence": _mean([g["competence"] for g in scored.groups]),
        "rl/competence_global": table.global_value,
        "rl/competence_keys": float(len(table.tally["key"])),
        "rl/competence_cells": float(len(table.tally["cell"])),
        "rl/lambda": _mean(lam_g),
        "rl/lambda_min": float(min(lam_g)) if lam_g else float("nan"),
        "rl/lambda_max": float(max(lam_g)) if lam_g else float("nan"),
        "rl/own_key_share": _mean([float(g["own"]) for g in scored.groups]),
        "rl/adv_mean": _mean(adv),
        "rl/adv_std": float(np.std(adv)) if len(adv) else float("nan"),
        "rl/zero_var_groups": float(zero_var),
        "rl/clip_frac": upd("clip_frac"),
        "rl/kl": upd("kl"),
        "rl/entropy": upd("entropy"),
        "rl/ratio_mean": upd("ratio"),
        "rl/ratio_max": max((u["ratio_max"] for u in good), default=float("nan")),
        "rl/ratio_min": min((u["ratio_min"] for u in good), default=float("nan")),
        "rl/logprob_gap": first.get("logprob_gap", float("nan")),
        "rl/loss": upd("loss"),
        "rl/grad_norm": upd("grad_norm"),
        "rl/lr": first.get("lr", float("nan")),
        "rl/updates": float(len(report.updates)),
        "rl/nonfinite_updates": float(report.nonfinite),
        "rl/train_sequences": float(report.sequences),
        "rl/train_tokens": float(sum(u["tokens"] for u in good)),
        "rl/rollouts": float(len(rollouts.trajs)),
        "rl/row_len": float(report.layout["row_len"]),
        "rl/rows_per_device": float(report.layout["rows_per_device"]),
        "rl/micro_batches": float(report.layout["micro_batches"]),
        "rl/weight_version": float(version),
        "rl/infra_dropped": float(sum(rollouts.dropped.values())),
        "rl/groups_drawn": float(drawn),
        "rl/groups_kept": float(len(rollouts.draws)),
        # zero-variance share of what was drawn: selection drops such groups before training
        "rl/zero_var_share": float(1.0 - (len(rollouts.draws) - zero_var) / max(drawn, 1)),
        **{f"time/{k}": float(v) for k, v in times.items()},
    }
    for kind in sorted({k for k, _ in rollouts.draws} | set(rollouts.dropped)):
        idx = [i for i in range(len(rollouts.trajs)) if rollouts.kind_of(i) == kind]
        m[f"rl/episodes/{kind}"] = float(len(idx))
        m[f"rl/success/{kind}"] = _mean(scored.success[idx].astype(float)) if idx else float("nan")
        m[f"rl/infra_dropped/{kind}"] = float(rollouts.dropped.get(kind, 0))
    return m


def why_no_update(m: dict[str, float]) -> str:
    """Why a step changed no weights, in words (the console line says it instead of `clip nan gap nan`)."""
    if m["rl/nonfinite_updates"] > 0:
        return f"NON-FINITE updates {int(m['rl/nonfinite_updates'])} (weights unchanged)"
    if m["rl/rollouts"] == 0:
        return f"no update: no group with reward variance in {int(m['rl/groups_drawn'])} drawn"
    return (f"no update: all {int(m['rl/groups_kept'])} groups unanimous (every advantage 0)"
            if m["rl/zero_var_groups"] >= m["rl/groups_kept"] else "no update: no rollout with a non-zero advantage")


def console_line(done: int, total: int, m: dict[str, float]) -> str:
    """The step's one progress line."""
    head = (f"rl step {done}/{total}: success {m['rl/success']:.3f} output_tokens {m['rl/output_tokens']:.1f}"
            f" lambda {m['rl/lambda_min']:.2f}/{m['rl/lambda']:.2f}/{m['rl/lambda_max']:.2f} own {m['rl/own_key_share']:.2f}")
    if m["rl/updates"] > m["rl/nonfinite_updates"] and not math.isnan(m["rl/clip_frac"]):
        tail = f" adv_std {m['rl/adv_std']:.3f} clip {m['rl/clip_frac']:.3f} gap {m['rl/logprob_gap']:.2e}"
        if m["rl/nonfinite_updates"]:
            tail += f" NON-FINITE updates {int(m['rl/nonfinite_updates'])}"
        return head + tail
    return head + " " + why_no_update(m)


def write_competence(workdir: str, step: int, scored: Scored, table: CompetenceTable, selection: dict[str, Any] | None) -> None:
    """One line per step in `<workdir>/competence.jsonl` (rewritten from the step on when a resumed run repeats it):
    the step's groups, the CARE table after the step, and with competence-aware selection what it draws by (`templates`:
    template -> [its competence in the table, the episodes behind its own key])."""
    path = os.path.join(workdir, "competence.jsonl")
    lines = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f if ln.strip() and json.loads(ln)["step"] < step]
    row: dict[str, Any] = {"step": step, "groups": scored.groups, "table": table.to_dict()}
    if selection is not None:
        row.update(selection)
    write_text(path, "".join(lines + [json.dumps(row, sort_keys=True) + "\n"]))
