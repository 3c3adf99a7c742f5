"""Eval metrics (mpa_jax.eval.metrics): success, partial score, pass@1, pass^k, costs, on hand-built trajectories."""
import math

import pytest

from mpa_jax.envs import Trajectory, Verification, load_tasks
from mpa_jax.eval import PriceTable, eval_metrics, pass_at_k, pass_hat_k, stratified


def _traj(task, ok, score, cat="tool_use", dom="utilities", out=10, inp=100, calls=1, dev=0.5, infra=False):
    return Trajectory(task_id=task, tokens=[], loss_mask=[], logprobs=[], steps=[],
                      verification=Verification(success=ok, score=score, infra_error=infra),
                      costs={"output_tokens": out, "input_tokens": inp, "tool_calls": calls, "device_s": dev},
                      provenance={"category": cat, "domain": dom}, infra_failure=infra)


def test_pass_estimators():
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(4, 3, 4) == 0.0
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 0, 3) == 0.0 and pass_at_k(4, 2, 3) == 1.0
    with pytest.raises(ValueError):
        pass_hat_k(2, 1, 3)


def test_metrics_over_k_runs_by_category_and_domain():
    # task a: 2/2 successes; task b: 1/2 (scores 1, 0.5); task c (memory): 0/2 with partial 0.25 each
    trajs = [_traj("a", True, 1.0), _traj("a", True, 1.0),
             _traj("b", True, 1.0, dom="media"), _traj("b", False, 0.5, dom="media"),
             _traj("c", False, 0.25, cat="memory", out=30, calls=3), _traj("c", False, 0.25, cat="memory", out=30, calls=3),
             _traj("d", False, 0.0, infra=True)]
    prices = PriceTable(input_per_mtok=1.0, output_per_mtok=10.0, per_tool_call=0.001, per_device_second=0.01)
    m = eval_metrics(trajs, k=2, prices=prices)
    o = m["overall"]
    assert m["infra_failures"] == 1 and o["tasks"] == 3 and o["runs"] == 6
    assert o["success"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert o["pass@1"] == pytest.approx(o["success"])
    assert o["pass^2"] == pytest.approx(1 / 3)  # only task a succeeds in both runs
    assert o["partial_score"] == pytest.approx((1.0 + 0.75 + 0.25) / 3)
    assert set(m["by_category"]) == {"Tool Use", "Memory"}
    assert m["by_category"]["Memory"]["success"] == 0.0 and m["by_category"]["Tool Use"]["pass^2"] == pytest.approx(0.5)
    assert m["by_domain"]["media"]["tasks"] == 1 and m["by_domain"]["media"]["success"] == pytest.approx(0.5)
    assert o["mean_output_tokens"] == pytest.approx((4 * 10 + 2 * 30) / 6)
    assert o["mean_output_tokens_success"] == 10 and o["mean_output_tokens_failure"] == pytest.approx((10 + 2 * 30) / 3)
    assert o["mean_tool_calls"] == pytest.approx((4 + 6) / 6)
    c = o["cost_per_1k_tasks"]
    # per run: input 100 tok at 1/M, output at 10/M, calls at 0.001, 0.5 device s at 0.01 -> x1000 per 1k tasks
    assert c["input_tokens"] == pytest.approx(1000 * 100 / 1e6)
    assert c["output_tokens"] == pytest.approx(1000 * 10 * o["mean_output_tokens"] / 1e6)
    assert c["tool_calls"] == pytest.approx(1000 * 0.001 * o["mean_tool_calls"])
    assert c["device_seconds"] == pytest.approx(1000 * 0.5 * 0.01)
    assert c["total"] == pytest.approx(sum(v for k, v in c.items() if k != "total"))
    assert o["cost_per_1k_tasks_output_only"] == c["output_tokens"] < c["total"]


def test_k_must_be_positive_and_empty_input_is_zero():
    with pytest.raises(ValueError, match="k must be"):
        eval_metrics([], k=0)
    m = eval_metrics([], k=1)
    assert m["overall"]["tasks"] == 0 and m["overall"]["success"] == 0.0 and not math.isnan(m["overall"]["cost_per_1k_tasks"]["total"])


def test_stratified_sample_covers_every_domain_and_category_first():
    tasks = load_tasks("dev")
    cells = {(t.domain, t.category) for t in tasks}
    sample = stratified(tasks, len(cells))
    assert {(t.domain, t.category) for t in sample} == cells
    domains = {d for d, _ in cells}
    first = stratified(tasks, len(domains))
    assert {t.domain for t in first} == domains
    assert len({t.category for t in first}) == len({c for _, c in cells})
    assert len({t.id for t in stratified(tasks, 100)}) == 100
    assert stratified(tasks, 10) == stratified(tasks, 10)
