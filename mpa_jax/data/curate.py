"""Curation: verified successes for SFT, failures kept apart for harness mining, a datasheet beside it.

Order of the filters (each drop is counted by reason in the datasheet):
1. infra failures out (the world's fault: neither example nor failure);
2. verified successes -> SFT candidates; the rest -> failures (for harness mining, `failure_clusters`);
3. deduplication on the rendered chat (same messages = same example, whatever the source);
4. length cap on tokens;
5. balancing to a target distribution over domain x category x difficulty: each cell keeps at most
   its share of the budget (`max_examples`, default all), filled from the least-represented cells first;
6. recovery traces (an error Feedback and still a verified success) are mixed in up to
   `recovery_fraction` of the dataset even past their cell's quota: they teach what to do when a tool
   says no.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import statistics
from typing import Any, Mapping, Sequence

from mpa_jax.data.keys import key_of_trajectory
from mpa_jax.envs.contract import Trajectory, canonical_json
from mpa_jax.files import write_json, write_jsonl


@dataclasses.dataclass
class CurationConfig:
    """What curation keeps. `target` maps cells to relative weights (None = uniform over present cells)."""

    max_tokens: int = 2048
    max_examples: int = 0  # 0 = no budget (balance only caps cells by their share when a budget is set)
    target: Mapping[str, float] | None = None
    recovery_fraction: float = 0.2
    seed: int = 0

    @classmethod
    def from_config(cls, data_cfg: Any, max_tokens: int | None = None, target: Mapping[str, float] | None = None) -> "CurationConfig":
        return cls(max_tokens=int(max_tokens if max_tokens is not None else data_cfg.max_tokens),
                   max_examples=int(data_cfg.max_examples), target=target,
                   recovery_fraction=float(data_cfg.recovery_fraction))


def is_recovery(traj: Trajectory) -> bool:
    """A verified success whose episode met at least one error Feedback (and recovered)."""
    ok = traj.verification is not None and traj.verification.success
    return bool(ok and any(s.feedback is not None and not s.feedback.ok for s in traj.steps))


def _fingerprint(traj: Trajectory) -> str:
    body = canonical_json(traj.messages) if traj.messages else json.dumps(traj.tokens)
    return hashlib.sha256(body.encode()).hexdigest()


@dataclasses.dataclass
class CurationResult:
    """The SFT examples, the failures (for harness mining) and the datasheet."""

    examples: list[Trajectory]
    failures: list[Trajectory]
    datasheet: dict[str, Any]

    def write(self, path: str, name: str = "") -> str:
        """Write `path` (SFT JSONL), `<path>.failures.jsonl` and the datasheet `<stem>.datasheet.json`; returns the datasheet path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        stem = path[:-6] if path.endswith(".jsonl") else path
        write_jsonl(path, self.examples)
        write_jsonl(stem + ".failures.jsonl", self.failures)
        sheet = dict(self.datasheet, name=name or os.path.basename(stem), path=os.path.abspath(path),
                     failures_path=os.path.abspath(stem + ".failures.jsonl"))
        ds = stem + ".datasheet.json"
        write_json(ds, sheet)
        self.datasheet = sheet
        return ds


def _lengths(trajs: Sequence[Trajectory]) -> dict[str, float]:
    xs = sorted(len(t.tokens) for t in trajs)
    if not xs:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "max": 0.0, "mean_output_tokens": 0.0}
    return {"n": len(xs), "mean": statistics.fmean(xs), "p50": float(xs[len(xs) // 2]),
            "p90": float(xs[min(len(xs) - 1, int(0.9 * len(xs)))]), "max": float(xs[-1]),
            "mean_output_tokens": statistics.fmean(sum(t.loss_mask) for t in trajs)}


def curate(trajectories: Sequence[Trajectory], cfg: CurationConfig | None = None) -> CurationResult:
    """Filter, deduplicate, cap, balance and mix `trajectories` into an SFT set (see the module doc)."""
    cfg = cfg or CurationConfig()
    drops: collections.Counter[str] = collections.Counter()
    candidates: list[Trajectory] = []
    failures: list[Trajectory] = []
    for t in trajectories:
        if t.infra_failure or t.verification is None or t.verification.infra_error:
            drops["infra"] += 1
        elif t.verification.success:
            candidates.append(t)
        else:
            failures.append(t)
    seen: set[str] = set()
    unique: list[Trajectory] = []
    for t in candidates:
        fp = _fingerprint(t)
        if fp in seen:
            drops["duplicate"] += 1
            continue
        seen.add(fp)
        unique.append(t)
    capped = []
    for t in unique:
        if len(t.tokens) > cfg.max_tokens:
            drops["too_long"] += 1
        else:
            capped.append(t)

    by_key: dict[str, list[Trajectory]] = collections.defaultdict(list)
    for t in capped:
        by_key[key_of_trajectory(t)].append(t)
    keys = sorted(by_key)
    if cfg.target:
        tw = {k: max(0.0, float(cfg.target.get(k, 0.0))) for k in keys}
        if sum(tw.values()) <= 0:
            tw = {k: 1.0 for k in keys}
    else:
        tw = {k: 1.0 for k in keys}
    total_w = sum(tw.values()) or 1.0
    budget = cfg.max_examples if cfg.max_examples > 0 else len(capped)
    n_recovery_target = int(math.floor(cfg.recovery_fraction * budget))
    # quota per cell: its share of the budget; cells with fewer examples leave their rest to the others
    quota = {k: 0 for k in keys}
    remaining = budget
    open_keys = [k for k in keys if tw[k] > 0]
    while remaining > 0 and open_keys:
        w = sum(tw[k] for k in open_keys)
        give = {k: max(1, int(remaining * tw[k] / w)) for k in open_keys}
        progressed = False
        for k in sorted(open_keys, key=lambda k: len(by_key[k])):
            room = len(by_key[k]) - quota[k]
            g = min(give[k], room, remaining)
            if g > 0:
                quota[k] += g
                remaining -= g
                progressed = True
        open_keys = [k for k in open_keys if quota[k] < len(by_key[k])]
        if not progressed:
            break
    kept: list[Trajectory] = []
    spare_recoveries: list[Trajectory] = []
    for k in keys:
        # recoveries first inside a cell, so the quota favours them
        items = sorted(by_key[k], key=lambda t: (not is_recovery(t), t.task_id))
        kept += items[:quota[k]]
        rest = items[quota[k]:]
        spare_recoveries += [t for t in rest if is_recovery(t)]
        drops["balance"] += sum(1 for t in rest if not is_recovery(t))
    n_rec = sum(1 for t in kept if is_recovery(t))
    extra = spare_recoveries[:max(0, n_recovery_target - n_rec)]
    kept += extra
    drops["balance"] += len(spare_recoveries) - len(extra)

    def counts(ts: Sequence[Trajectory], fn: Any) -> dict[str, int]:
        return dict(sorted(collections.Counter(fn(t) for t in ts).items()))

    shares = counts(kept, key_of_trajectory)
    n = len(kept) or 1
    sheet = {
        "examples": len(kept),
        "failures": len(failures),
        "input_trajectories": len(trajectories),
        "drops": {k: v for k, v in sorted(drops.items()) if v},
        "recovery_traces": sum(1 for t in kept if is_recovery(t)),
        "recovery_fraction_target": cfg.recovery_fraction,
        "max_tokens": cfg.max_tokens,
        "sources": counts(kept, lambda t: str(t.provenance.get("planner", "?"))),
        "by_category": counts(kept, lambda t: str(t.provenance.get("category", "?"))),
        "by_domain": counts(kept, lambda t: str(t.provenance.get("domain", "?"))),
        "by_key": shares,
        "balance": {k: {"target": tw.get(k, 0.0) / total_w, "actual": shares.get(k, 0) / n} for k in keys},
        "lengths": _lengths(kept),
        "failure_lengths": _lengths(failures),
    }
    return CurationResult(examples=kept, failures=failures, datasheet=sheet)


def failure_clusters(failures: Sequence[Trajectory], top: int = 20) -> list[dict[str, Any]]:
    """Failures clustered by (tool, error code) of their first failed call, or by how they ended
    (no tool error: a wrong answer, the turn limit, ...): the input of harness mining."""
    clusters: dict[tuple[str, str], list[Trajectory]] = collections.defaultdict(list)
    for t in failures:
        key = None
        for s in t.steps:
            if s.feedback is not None and not s.feedback.ok:
                code = s.feedback.error_code.value if hasattr(s.feedback.error_code, "value") else str(s.feedback.error_code)
                key = (s.action.name or s.action.kind, code)
                break
        if key is None:
            key = ("-", f"finish:{t.finish_reason or 'unknown'}")
        clusters[key].append(t)
    out = [{"tool": k[0], "error": k[1], "count": len(v), "tasks": sorted({t.task_id for t in v})[:5],
            "categories": dict(collections.Counter(str(t.provenance.get("category", "?")) for t in v))}
           for k, v in clusters.items()]
    out.sort(key=lambda c: (-c["count"], c["tool"], c["error"]))
    return out[:top]
