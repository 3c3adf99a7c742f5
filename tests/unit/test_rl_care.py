"""CARE / vanilla advantage maths (mpa_jax.rl.care): the invariants of DESIGN §6 as property tests."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpa_jax.rl import care


def rl_cfg(**kw) -> ml_collections.ConfigDict:
    from configs.tiny import get_config

    c = get_config().rl
    c.update(kw)
    return c


@st.composite
def batches(draw, distinct_costs: bool = False):
    """Groups of rollouts (a task each); keys are templates shared by several groups."""
    n_groups = draw(st.integers(1, 5))
    n_keys = draw(st.integers(1, 3))
    success, cost, group, key, comp = [], [], [], [], []
    key_comp = [draw(st.floats(0.0, 1.0)) for _ in range(n_keys)]
    for g in range(n_groups):
        size = draw(st.integers(1, 8))
        k = draw(st.integers(0, n_keys - 1))
        if distinct_costs:
            costs = draw(st.lists(st.integers(0, 5000), min_size=size, max_size=size, unique=True))
        else:
            costs = draw(st.lists(st.integers(0, 5000), min_size=size, max_size=size))
        for j in range(size):
            success.append(draw(st.booleans()))
            cost.append(float(costs[j]))
            group.append(g)
            key.append(k)
            comp.append(key_comp[k])
    return dict(success=np.array(success), cost=np.array(cost), group=np.array(group), key=np.array(key),
                competence=np.array(comp))


cfgs = st.builds(
    lambda algo, lam, lo, width, beta, clip, neg, sharp, fail: rl_cfg(
        algo=algo, lambda_max=lam, c_lo=lo, c_hi=min(1.0, lo + width), beta=beta, adv_clip=clip, negative_scale=neg,
        cost_sharpness=sharp, failure_cost=fail),
    st.sampled_from(["care", "vanilla"]), st.floats(0.0, 1.0), st.floats(0.0, 0.8), st.floats(0.05, 0.5),
    st.floats(0.0, 3.0), st.floats(0.5, 10.0), st.sampled_from([1.0, 0.5, 0.0]), st.sampled_from([1.0, 0.25, 3.0, 20.0]),
    st.sampled_from([0.0, 0.0, 1.0, 3.0]),
)


@settings(max_examples=200, deadline=None)
@given(batches(), cfgs)
def test_every_success_beats_every_failure_and_all_failures_get_zero(b, cfg):
    adv = care.advantages(**b, cfg=cfg)
    assert adv.shape == b["success"].shape and np.all(np.isfinite(adv))
    for g in np.unique(b["group"]):
        sel = b["group"] == g
        s, a = b["success"][sel], adv[sel]
        if s.any() and (~s).any():
            assert a[s].min() > a[~s].max()
        if not s.any():
            assert np.all(a == 0)
        if str(cfg.algo) == "care":
            assert np.all(np.abs(a) < float(cfg.adv_clip))


@settings(max_examples=150, deadline=None)
@given(batches(), cfgs, st.data())
def test_vanilla_ignores_cost_and_equal_outcomes_get_zero(b, cfg, data):
    cfg.algo = "vanilla"
    adv = care.advantages(**b, cfg=cfg)
    other = dict(b, cost=np.array(data.draw(st.lists(st.floats(0, 1e4), min_size=len(b["cost"]), max_size=len(b["cost"])))))
    np.testing.assert_array_equal(adv, care.advantages(**other, cfg=cfg))
    for g in np.unique(b["group"]):
        sel = b["group"] == g
        if len(set(b["success"][sel].tolist())) == 1:
            assert np.all(adv[sel] == 0)


@settings(max_examples=150, deadline=None)
@given(batches(), cfgs)
def test_care_below_c_lo_equals_care_without_costs(b, cfg):
    cfg.algo = "care"
    b = dict(b, competence=b["competence"] * float(cfg.c_lo) * 0.999)  # every key below c_lo
    adv = care.advantages(**b, cfg=cfg)
    np.testing.assert_array_equal(adv, care.advantages(**dict(b, cost=np.zeros_like(b["cost"])), cfg=cfg))


@settings(max_examples=150, deadline=None)
@given(batches(distinct_costs=True), cfgs, st.floats(0.05, 1.0))
def test_care_above_c_hi_prefers_the_cheaper_success(b, cfg, lam):
    cfg.algo, cfg.lambda_max = "care", lam
    b = dict(b, competence=np.clip(float(cfg.c_hi) + b["competence"] * (1 - float(cfg.c_hi)), float(cfg.c_hi), 1.0))
    adv = care.advantages(**b, cfg=cfg)
    for g in np.unique(b["group"]):
        sel = (b["group"] == g) & b["success"]
        if sel.sum() < 2:
            continue
        c, a = b["cost"][sel], adv[sel]
        order = np.argsort(c)
        d, tail = np.diff(a[order]), a[order][1:]
        # Strictly cheaper-is-better, except where the soft clip saturates in floating point (tanh == 1).
        saturated = (d == 0) & np.isclose(np.abs(tail), float(cfg.adv_clip), rtol=0, atol=1e-12)
        assert np.all((d < 0) | saturated), (c[order], a[order])


@settings(max_examples=150, deadline=None)
@given(batches(distinct_costs=True), cfgs, st.floats(0.05, 1.0), st.floats(0.1, 3.0))
def test_failure_term_prices_the_costlier_failure_only_beside_a_success(b, cfg, lam, fail):
    cfg.algo, cfg.lambda_max, cfg.failure_cost = "care", lam, fail
    b = dict(b, competence=np.clip(float(cfg.c_hi) + b["competence"] * (1 - float(cfg.c_hi)), float(cfg.c_hi), 1.0))
    r = care.rewards(**b, cfg=cfg)
    adv = care.advantages(**b, cfg=cfg)
    for g in np.unique(b["group"]):
        sel = b["group"] == g
        s = b["success"][sel]
        if not s.any():  # nothing to learn beside: no failure term, rewards equal
            assert np.all(r[sel] == 0) and np.all(adv[sel] == 0)
            continue
        assert np.all(r[sel][~s] <= 0) and np.all(r[sel][~s] >= -fail * lam)
        fsel = sel & ~b["success"]
        if fsel.sum() >= 2:
            order = np.argsort(b["cost"][fsel])
            assert np.all(np.diff(adv[fsel][order]) <= 0)
            if float(cfg.negative_scale) > 0:  # (0 pulls every failure onto one anchor)
                assert adv[fsel][order][0] > adv[fsel][order][-1]  # the costliest failure strictly below the cheapest


def test_failure_term_worked_example():
    # one group: a success (cost 10) and two failures (cost 100 and 300, the key's only failures: z = -+1)
    b = dict(success=np.array([True, False, False]), cost=np.array([10.0, 100.0, 300.0]), key=np.zeros(3, int),
             competence=np.ones(3))
    cfg = rl_cfg(lambda_max=1.0, c_lo=0.0, c_hi=0.5, cost_sharpness=3.0, failure_cost=1.0)
    # fail_hat = softsign(3 * -+1) = -+0.75: r = -(1 -+ 0.75) / 2
    np.testing.assert_allclose(care.rewards(**b, group=np.zeros(3), cfg=cfg), [1.0, -0.125, -0.875])
    # the same failures in a group of their own get no term; vanilla never has one
    np.testing.assert_allclose(care.rewards(**b, group=np.array([0, 1, 1]), cfg=cfg), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(care.rewards(**b, group=np.zeros(3), cfg=rl_cfg(algo="vanilla", failure_cost=1.0)), [1, 0, 0])
    with pytest.raises(ValueError, match="failure_cost"):
        care.check_rl_config(rl_cfg(failure_cost=-0.5))


def test_lambda_schedule_and_hard_key_amplification():
    cfg = rl_cfg(lambda_max=0.5, c_lo=0.2, c_hi=0.6, beta=1.0, adv_clip=100.0)
    np.testing.assert_allclose(care.lambda_schedule([0.0, 0.2, 0.4, 0.6, 1.0], cfg), [0, 0, 0.25, 0.5, 0.5])
    base = dict(success=np.array([True, False]), cost=np.array([5.0, 5.0]), group=np.array([0, 0]), key=np.array([0, 0]))
    easy = care.advantages(**base, competence=np.array([0.9, 0.9]), cfg=cfg)
    hard = care.advantages(**base, competence=np.array([0.1, 0.1]), cfg=cfg)
    # (1 - 0.5) / 0.5 = 1 before calibration; x (1 + beta (1 - c)); failures are not amplified
    np.testing.assert_allclose(easy, [1.1 * 100 * np.tanh(1.1 / 100) / 1.1, -100 * np.tanh(1 / 100)], rtol=1e-5)
    assert hard[0] > easy[0] and hard[1] == pytest.approx(easy[1])


def test_cost_normalised_within_key_over_successes_only():
    cfg = rl_cfg(lambda_max=1.0, c_lo=0.0, c_hi=0.5, adv_clip=100.0, beta=0.0)
    # key 0 is long (costs ~1000), key 1 short (~10): each normalised against its own successes
    success = np.array([True, True, True, True, False])
    cost = np.array([1000.0, 1200.0, 10.0, 12.0, 1.0])
    key = np.array([0, 0, 1, 1, 1])
    ch = care.normalised_cost(success, cost, key)
    np.testing.assert_allclose(ch, [-0.5, 0.5, -0.5, 0.5, 0.0])
    r = care.rewards(success=success, cost=cost, key=key, competence=np.ones(5), cfg=cfg)
    np.testing.assert_allclose(r, [1.5, 0.5, 1.5, 0.5, 0.0])
    # sharpness 3: z = +-1 becomes +-3 before the softsign, so the same successes pay 3/4 of lambda, not 1/2
    np.testing.assert_allclose(care.normalised_cost(success, cost, key, 3.0), [-0.75, 0.75, -0.75, 0.75, 0.0])
    r3 = care.rewards(success=success, cost=cost, key=key, competence=np.ones(5), cfg=rl_cfg(
        lambda_max=1.0, c_lo=0.0, c_hi=0.5, cost_sharpness=3.0))
    np.testing.assert_allclose(r3, [1.75, 0.25, 1.75, 0.25, 0.0])
    with pytest.raises(ValueError, match="cost_sharpness"):
        care.check_rl_config(rl_cfg(cost_sharpness=0.0))


def test_negative_scale_damps_failures_only():
    b = dict(success=np.array([True, False, False, True, False]), cost=np.array([10.0, 20.0, 30.0, 5.0, 5.0]),
             group=np.array([0, 0, 0, 1, 1]), key=np.array([0, 0, 0, 1, 1]), competence=np.full(5, 0.5))
    full = care.advantages(**b, cfg=rl_cfg(algo="vanilla"))
    half = care.advantages(**b, cfg=rl_cfg(algo="vanilla", negative_scale=0.5))
    none = care.advantages(**b, cfg=rl_cfg(algo="vanilla", negative_scale=0.0))
    assert np.all(full[~b["success"]] < 0) and np.all(full[b["success"]] > 0)
    np.testing.assert_allclose(half, np.where(full < 0, full / 2, full))
    np.testing.assert_array_equal(none, np.where(full < 0, 0.0, full))
    # CARE: a costly success below the group mean stays above the (damped) failures
    costly = dict(b, success=np.array([True, True, False, True, False]), cost=np.array([10.0, 900.0, 0.0, 5.0, 5.0]))
    adv = care.advantages(**costly, cfg=rl_cfg(algo="care", lambda_max=1.0, c_lo=0.0, c_hi=0.1, negative_scale=0.0))
    assert adv[1] < 0 and adv[2] < adv[1]
    with pytest.raises(ValueError, match="config.rl.negative_scale"):
        care.check_rl_config(rl_cfg(negative_scale=1.5))


def test_bad_config_and_inputs_name_the_problem():
    with pytest.raises(ValueError, match="config.rl.algo"):
        care.advantages(success=[True], cost=[1.0], group=[0], key=[0], competence=[0.0], cfg=rl_cfg(algo="ppo"))
    with pytest.raises(ValueError, match="lambda_max"):
        care.check_rl_config(rl_cfg(lambda_max=2.0))
    with pytest.raises(ValueError, match="config.rl.optimizer"):
        care.check_rl_config(rl_cfg(optimizer="adam"))
    with pytest.raises(ValueError, match="cost has shape"):
        care.advantages(success=[True, False], cost=[1.0], group=[0, 0], key=[0, 0], competence=[0.0, 0.0], cfg=rl_cfg())


def test_lambda_size_matters_in_all_success_groups():
    """Issue 50: group-normalising by the rewards' std made any lambda > 0 a unit-size length advantage in an
    all-success group; CARE now leaves such a group's advantages in reward units, so they scale with lambda."""
    b = dict(success=np.ones(4, bool), cost=np.array([10.0, 20.0, 30.0, 40.0]), group=np.zeros(4, int), key=np.zeros(4, int),
             competence=np.ones(4))
    small = care.advantages(**b, cfg=rl_cfg(lambda_max=0.1, c_lo=0.0, c_hi=0.5, adv_clip=100.0))
    big = care.advantages(**b, cfg=rl_cfg(lambda_max=1.0, c_lo=0.0, c_hi=0.5, adv_clip=100.0))
    assert np.all(np.diff(small) < 0) and np.allclose(big, 10 * small, rtol=1e-3)
    assert np.abs(big).max() < 2.0  # at most 2 lambda: a success's worth of reward each way
    # a mixed group keeps vanilla's scale: with lambda 0 CARE (beta 0) is vanilla up to the smooth clip
    m = dict(b, success=np.array([True, False, True, False]))
    np.testing.assert_allclose(care.advantages(**m, cfg=rl_cfg(lambda_max=0.0, adv_clip=1e6)),
                               care.advantages(**m, cfg=rl_cfg(algo="vanilla")), rtol=1e-6)


@settings(max_examples=150, deadline=None)
@given(batches(), cfgs)
def test_matched_arms_keep_the_same_groups(b, cfg):
    """Which groups are kept does not depend on rl.algo (DESIGN §6.3), and a kept group is one with reward
    variance under CARE's reward or vanilla's."""
    for g in np.unique(b["group"]):
        sel = b["group"] == g
        args = dict(success=b["success"][sel], cost=b["cost"][sel], competence=b["competence"][sel])
        cfg.algo = "care"
        kept_care = care.group_has_signal(**args, cfg=cfg)
        cfg.algo = "vanilla"
        kept_vanilla = care.group_has_signal(**args, cfg=cfg)
        assert kept_care == kept_vanilla
        cfg.algo = "care"
        r_care = care.rewards(**args, key=np.zeros(sel.sum(), int), cfg=cfg)
        r_van = args["success"].astype(float)
        assert kept_care == (sel.sum() > 1 and (r_care.std() > 1e-9 or r_van.std() > 0))


def test_has_signal_needs_lambda_of_the_keys_competence_not_lambda_max():
    """The old rule kept an all-success group with distinct costs whenever rl.lambda_max > 0, even below c_lo where
    lambda(c_k) = 0 and every advantage is 0."""
    cfg = rl_cfg(lambda_max=0.5, c_lo=0.3, c_hi=0.8)
    ok = dict(success=np.ones(3, bool), cost=np.array([10.0, 20.0, 30.0]))
    assert not care.group_has_signal(**ok, competence=np.full(3, 0.2), cfg=cfg)  # below c_lo: lambda 0
    assert care.group_has_signal(**ok, competence=np.full(3, 0.5), cfg=cfg)
    assert not care.group_has_signal(**dict(ok, cost=np.full(3, 20.0)), competence=np.full(3, 0.9), cfg=cfg)  # equal costs
    assert not care.group_has_signal(success=np.zeros(3, bool), cost=ok["cost"], competence=np.full(3, 0.9), cfg=cfg)
    assert care.group_has_signal(success=np.array([True, False, True]), cost=ok["cost"], competence=np.full(3, 0.0), cfg=cfg)
    assert not care.group_has_signal(success=np.ones(3, bool), cost=ok["cost"], competence=np.full(3, 0.9),
                                     cfg=rl_cfg(lambda_max=0.0))  # no length term at all
