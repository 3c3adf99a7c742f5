"""The one definition of benchmark metrics from trajectories: success, partial score, pass@1, pass^k,
lengths, tool calls, cost; overall and grouped by category, domain and template group (templates seen in
training vs held-out templates). Every evaluation (`mpa eval`, the SFT success hook, the demo, the loop)
reads its figures from here.

Runs are grouped by task. With n scored runs of a task of which c succeed:
- success = mean over tasks of c / n (the expected single-run success; equals pass@1);
- partial score = mean over tasks of the mean Verification score;
- pass@1 = mean of c / n; pass^k = mean of C(c, k) / C(n, k) (all k of k runs succeed: reliability,
  tau-bench's estimator, exact when n = k); with `ks`, the unbiased pass@j = mean of 1 - C(n-c, j) / C(n, j)
  (at least one of j runs succeeds) for each j, so a sampled evaluation reports both together;
- mean output/input tokens, tool calls and device seconds per run; mean output tokens of the successful
  runs and of the failed ones apart (where a length cut at kept accuracy can come from);
- cost per 1,000 tasks from a price table counting input tokens, output tokens, tool calls and
  device seconds separately, plus the output-tokens-only figure the seed work reported.
Infra failures are counted and excluded (never scored as the policy's failure).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Iterable, Mapping, Sequence

from mpa_jax.eval.tasks import template_group

CATEGORY_NAMES = {"tool_use": "Tool Use", "memory": "Memory", "skills": "Skills", "subagent": "Sub-agent", "followup": "Follow-up"}


@dataclasses.dataclass(frozen=True)
class PriceTable:
    """Prices: per million input tokens, per million output tokens, per tool call, per device second."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    per_tool_call: float = 0.0
    per_device_second: float = 0.0
    currency: str = "USD"

    @classmethod
    def from_config(cls, prices: Any) -> "PriceTable":
        return cls(input_per_mtok=float(prices.input_per_mtok), output_per_mtok=float(prices.output_per_mtok),
                   per_tool_call=float(prices.per_tool_call), per_device_second=float(prices.per_device_second),
                   currency=str(prices.currency))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: probability that at least one of k runs drawn from n (c correct) succeeds."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: probability that all k runs drawn from n (c correct) succeed."""
    if k > n:
        raise ValueError(f"pass^k needs k <= n runs, got k={k}, n={n}")
    return math.comb(c, k) / math.comb(n, k)


def _cost(costs: Mapping[str, float], prices: PriceTable) -> dict[str, float]:
    parts = {
        "input_tokens": float(costs.get("input_tokens", 0.0)) * prices.input_per_mtok / 1e6,
        "output_tokens": float(costs.get("output_tokens", 0.0)) * prices.output_per_mtok / 1e6,
        "tool_calls": float(costs.get("tool_calls", 0.0)) * prices.per_tool_call,
        "device_seconds": float(costs.get("device_s", 0.0)) * prices.per_device_second,
    }
    parts["total"] = sum(parts.values())
    return parts


def _block(runs_by_task: Mapping[str, list[Any]], k: int, prices: PriceTable, ks: Sequence[int] = ()) -> dict[str, Any]:
    tasks = [r for r in runs_by_task.values() if r]
    n_tasks = len(tasks)
    at_k = {f"pass@{j}": 0.0 for j in ks if j != 1}
    if not n_tasks:
        return {"tasks": 0, "runs": 0, "success": 0.0, "partial_score": 0.0, "pass@1": 0.0, **at_k, f"pass^{k}": 0.0,
                "mean_output_tokens": 0.0, "mean_output_tokens_success": 0.0, "mean_output_tokens_failure": 0.0, "mean_input_tokens": 0.0, "mean_tool_calls": 0.0, "mean_user_turns": 0.0, "mean_device_s": 0.0,
                "cost_per_1k_tasks": {"input_tokens": 0.0, "output_tokens": 0.0, "tool_calls": 0.0, "device_seconds": 0.0, "total": 0.0},
                "cost_per_1k_tasks_output_only": 0.0}
    succ, score, p1, pk = 0.0, 0.0, 0.0, 0.0
    runs = [t for r in tasks for t in r]
    for r in tasks:
        n = len(r)
        c = sum(1 for t in r if t.verification.success)
        succ += c / n
        score += sum(float(t.verification.score) for t in r) / n
        p1 += pass_at_k(n, c, 1)
        pk += pass_hat_k(n, c, min(k, n))
        for j in at_k:
            at_k[j] += pass_at_k(n, c, min(int(j[5:]), n)) / n_tasks
    per_run = [_cost(t.costs, prices) for t in runs]
    cost = {key: 1000.0 * sum(p[key] for p in per_run) / len(runs) for key in per_run[0]}
    m = len(runs)
    ok = [t for t in runs if t.verification.success]
    bad = [t for t in runs if not t.verification.success]

    def mean_out(rs: list[Any]) -> float:
        return sum(t.costs.get("output_tokens", 0.0) for t in rs) / len(rs) if rs else 0.0

    return {
        "tasks": n_tasks, "runs": m,
        "success": succ / n_tasks, "partial_score": score / n_tasks, "pass@1": p1 / n_tasks, **at_k, f"pass^{k}": pk / n_tasks,
        "mean_output_tokens": mean_out(runs), "mean_output_tokens_success": mean_out(ok), "mean_output_tokens_failure": mean_out(bad),
        "mean_input_tokens": sum(t.costs.get("input_tokens", 0.0) for t in runs) / m,
        "mean_tool_calls": sum(t.costs.get("tool_calls", 0.0) for t in runs) / m,
        "mean_user_turns": sum(t.costs.get("user_turns", 0.0) for t in runs) / m,  # conversations' follow-ups
        "mean_device_s": sum(t.costs.get("device_s", 0.0) for t in runs) / m,
        "cost_per_1k_tasks": cost,
        "cost_per_1k_tasks_output_only": cost["output_tokens"],
    }


def eval_metrics(trajectories: Iterable[Any], k: int = 1, prices: PriceTable | None = None,
                 ks: Sequence[int] = ()) -> dict[str, Any]:
    """Overall, per category (display names) and per domain metrics of `trajectories` (k runs per task); pass@j
    for each j of `ks` beside pass^k."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ks = [int(j) for j in ks]
    if ks and min(ks) < 1:
        raise ValueError(f"pass@k needs k >= 1, got {ks}")
    prices = prices or PriceTable()
    trajs = list(trajectories)
    scored = [t for t in trajs if not t.infra_failure and t.verification is not None and not t.verification.infra_error]
    by_task: dict[str, list[Any]] = collections.defaultdict(list)
    for t in scored:
        by_task[t.task_id].append(t)
    cat_of = {t.task_id: str(t.provenance.get("category", "?")) for t in scored}
    dom_of = {t.task_id: str(t.provenance.get("domain", "?")) for t in scored}
    grp_of = {t.task_id: template_group(str(t.provenance.get("template", ""))) for t in scored}

    def subset(pred: Any) -> dict[str, list[Any]]:
        return {tid: r for tid, r in by_task.items() if pred(tid)}

    cats = sorted(set(cat_of.values()))
    doms = sorted(set(dom_of.values()))
    return {
        "k": k,
        "prices": dataclasses.asdict(prices),
        "episodes": len(trajs),
        "infra_failures": len(trajs) - len(scored),
        # diagnostics over every episode, infra ones included: how episodes ended, malformed turns by kind
        "finish_reasons": dict(sorted(collections.Counter(t.finish_reason for t in trajs).items())),
        "output_errors": dict(sorted(sum((collections.Counter(t.provenance.get("output_errors") or {}) for t in trajs),
                                         collections.Counter()).items())),
        "ks": ks,
        "overall": _block(by_task, k, prices, ks),
        "by_category": {CATEGORY_NAMES.get(c, c): _block(subset(lambda tid, c=c: cat_of[tid] == c), k, prices, ks) for c in cats},
        "by_domain": {d: _block(subset(lambda tid, d=d: dom_of[tid] == d), k, prices, ks) for d in doms},
        "by_templates": {g: _block(subset(lambda tid, g=g: grp_of[tid] == g), k, prices, ks)
                         for g in ("seen", "held_out") if g in grp_of.values()},
    }


def success_view(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The flat success figures of `eval_metrics`' output (what the SFT hook logs and datasheets keep):
    `success`, `score`, `success_seen`, `success_held_out` (when such tasks ran), `success_<category>`."""
    out = {"success": float(metrics["overall"]["success"]), "score": float(metrics["overall"]["partial_score"])}
    names = {v: k for k, v in CATEGORY_NAMES.items()}
    for cat, b in metrics["by_category"].items():
        out[f"success_{names.get(cat, cat)}"] = float(b["success"])
    for group, b in metrics.get("by_templates", {}).items():
        out[f"success_{group}"] = float(b["success"])
    return out


def pass_at_k_metrics(trajectories: Iterable[Any], tasks: Sequence[Any], ks: Sequence[int]) -> dict[str, float]:
    """The flat pass@k view of `eval_metrics` over n sampled runs per task (every task of `tasks` needs >= max(ks)
    scored runs): `pass@<k>` overall, `pass@<k>_seen` / `pass@<k>_held_out` (template groups) and
    `pass@<k>_<category>`; plus `samples` (the smallest n). Infra failures are excluded (not the policy's failure)."""
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"pass@k needs k >= 1, got {ks}")
    trajs = [t for t in trajectories if not t.infra_failure and t.verification is not None and not t.verification.infra_error]
    runs = collections.Counter(t.task_id for t in trajs)
    for task in tasks:
        if runs[task.id] < max(ks):
            raise ValueError(f"task {task.id}: {runs[task.id]} scored runs, fewer than k={max(ks)} (raise the samples per task)")
    return passk_view(eval_metrics(trajs, k=max(ks), ks=ks), samples=min((runs[t.id] for t in tasks), default=0))


def passk_view(metrics: Mapping[str, Any], samples: int | None = None) -> dict[str, float]:
    """The flat pass@k figures of `eval_metrics(..., ks=...)`: `pass@<k>`, `pass@<k>_<seen|held_out>`,
    `pass@<k>_<category>` for each k of its `ks` (and `samples` when given)."""
    names = {v: k for k, v in CATEGORY_NAMES.items()}
    keys = [f"pass@{j}" for j in metrics["ks"]]
    out: dict[str, float] = {} if samples is None else {"samples": float(samples)}
    blocks = [("", metrics["overall"])] + [(f"_{g}", b) for g, b in metrics.get("by_templates", {}).items()]
    blocks += [(f"_{names.get(c, c)}", b) for c, b in metrics["by_category"].items()]
    for suffix, block in blocks:
        for key in keys:
            out[key + suffix] = float(block[key])
    return out
