"""CARE and vanilla group-relative advantages: host-side numpy, no model (DESIGN §6).

CARE (`cfg.algo == "care"`), per rollout i of group g (one task) and competence key k (template x difficulty,
`rl/competence.py`):

    r_i   = success_i * (1 - lambda(c_k) * cost_hat_i)
    a_i   = (r_i - mean_g r) / (std_g success + eps)   if the group mixes successes and failures
    a_i   =  r_i - mean_g r                              if every rollout succeeded (std_g success = 0)
    a_i  *= 1 + beta * (1 - c_k)        if success_i and a_i > 0        ablation: hard keys amplified (beta 0 = off)
    a_i   = adv_clip * tanh(a_i / adv_clip)                             clipped (smoothly)
    a_i   = 0                           if the group's rewards have no variance

The size of lambda means something everywhere (issue 50). Dividing by the std of the group's *rewards* (plain
GRPO) would turn any lambda > 0 into unit-size length advantages in an all-success group, so lambda's size would
hardly matter there. CARE divides by the std of the group's task outcome instead (the same scale as vanilla's
advantages), and not at all in all-success groups: there a_i = -lambda(c_k) (cost_hat_i - mean_g cost_hat), in
units of one success, so lambda 0.1 moves the policy a tenth as hard as lambda 1 and at most 2 lambda. With
lambda = 0 and beta = 0 CARE's advantages are vanilla's (up to the smooth clip). Both are affine in r with a
positive scale inside a group, so the order of rewards is the order of advantages.

Ablations (config flags, off in CARE as designed): `beta` > 0 (amplify hard keys' successes) and `failure_cost`
f > 0 (an opt-in price on failures' length): in a group that has a success, a failure gets
r_i = -f * lambda(c_k) * (1 + fail_hat_i) / 2 in (-f lambda, 0], fail_hat the same squashed z-score against the
*failed* rollouts of the key, so a failure that loops or wanders costs more than one that ends short, and still
ranks below every success. A group without a success gets no failure term.

`cost_hat` is the cost z-scored against the *successful* rollouts of the same key in the batch and
squashed into (-1, 1) (softsign of `cost_sharpness` * z), so long tasks are not punished for being long and, with
`lambda_max <= 1`, every success keeps a reward > 0 = a failure's. The invariants in `tests/unit/test_rl_care.py`:

- in every group every success gets a strictly larger advantage than every failure;
- a group of all failures (or any group of equal rewards) gets zeros;
- vanilla advantages do not depend on `cost`;
- below `c_lo` CARE equals CARE with every cost set to 0 (lambda is 0 there);
- above `c_hi` with `lambda_max > 0`, among the successes of a group the cheaper gets more;
- in an all-success group the advantages scale with lambda.

Matched arms (DESIGN §6.3): which groups a step trains on does not depend on `rl.algo`: `group_has_signal` keeps a
group whose rewards vary under CARE's reward (with the config's lambda schedule) *or* vanilla's, so both arms of
an experiment train on the same groups and differ only in the reward and advantage rules.

Vanilla (`cfg.algo == "vanilla"`) is plain group-relative RL: r = success, a = (r - mean)/(std + eps),
no cost, no calibration, no clip (DESIGN §6: "lambda = 0 and no calibration").
"""
from __future__ import annotations

from typing import Any

import numpy as np

ALGOS = ("care", "vanilla")
_EPS = 1e-6


def check_rl_config(cfg: Any) -> None:
    """Raise ValueError naming the first `config.rl` key whose value the maths cannot use."""
    algo = str(cfg.algo)
    if algo not in ALGOS:
        raise ValueError(f"config.rl.algo must be one of {ALGOS}, got {algo!r}")
    lo, hi, lam = float(cfg.c_lo), float(cfg.c_hi), float(cfg.lambda_max)
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"config.rl.c_lo={lo} and config.rl.c_hi={hi} must satisfy 0 <= c_lo < c_hi <= 1")
    if not (0.0 <= lam <= 1.0):
        raise ValueError(f"config.rl.lambda_max={lam} must be in [0, 1] (a success must always outrank a failure)")
    if float(cfg.beta) < 0:
        raise ValueError(f"config.rl.beta={cfg.beta} must be >= 0")
    if not float(cfg.adv_clip) > 0:
        raise ValueError(f"config.rl.adv_clip={cfg.adv_clip} must be > 0")
    if not float(cfg.cost_sharpness) > 0:
        raise ValueError(f"config.rl.cost_sharpness={cfg.cost_sharpness} must be > 0")
    if not float(cfg.failure_cost) >= 0:
        raise ValueError(f"config.rl.failure_cost={cfg.failure_cost} must be >= 0")
    if float(cfg.tool_call_cost) < 0:
        raise ValueError(f"config.rl.tool_call_cost={cfg.tool_call_cost} must be >= 0")
    if not float(cfg.competence_window) >= 1:
        raise ValueError(f"config.rl.competence_window={cfg.competence_window} must be >= 1 (episodes)")
    if not float(cfg.competence_prior) > 0:
        raise ValueError(f"config.rl.competence_prior={cfg.competence_prior} must be > 0 (pseudo-episodes)")
    if not 0.0 <= float(cfg.competence_init) <= 1.0:
        raise ValueError(f"config.rl.competence_init={cfg.competence_init} must be in [0, 1]")
    neg = float(cfg.negative_scale)
    if not (0.0 <= neg <= 1.0):
        raise ValueError(f"config.rl.negative_scale={neg} must be in [0, 1]")
    opt = str(cfg.optimizer)
    if opt not in ("adamw", "sgd"):
        raise ValueError(f"config.rl.optimizer must be 'adamw' or 'sgd', got {opt!r}")


def lambda_schedule(c: np.ndarray | float, cfg: Any) -> np.ndarray:
    """lambda(c): 0 below `c_lo` (explore), linear up to `lambda_max` at `c_hi`, flat above (economise)."""
    c = np.asarray(c, np.float64)
    lo, hi, lam = float(cfg.c_lo), float(cfg.c_hi), float(cfg.lambda_max)
    ramp = np.clip((c - lo) / (hi - lo), 0.0, 1.0)
    return lam * ramp


def rollout_cost(output_tokens: np.ndarray, tool_calls: np.ndarray, cfg: Any) -> np.ndarray:
    """Cost of a rollout: output tokens (reasoning included) + `tool_call_cost` per tool call."""
    return np.asarray(output_tokens, np.float64) + float(cfg.tool_call_cost) * np.asarray(tool_calls, np.float64)


def normalised_cost(success: np.ndarray, cost: np.ndarray, key: np.ndarray, sharpness: float = 1.0) -> np.ndarray:
    """cost_hat in (-1, 1): z-score against the rollouts of the same key that `success` selects (the
    successes; the failures for the failure term), times `sharpness`, softsign-squashed.

    Zero outside the selection and for keys whose selected rollouts all cost the same.
    """
    out = np.zeros(cost.shape, np.float64)
    for k in np.unique(key[success]):
        sel = success & (key == k)
        c = cost[sel]
        std = c.std()
        if std <= 0:
            continue
        z = sharpness * (c - c.mean()) / std
        out[sel] = z / (1.0 + np.abs(z))
    return out


def _check_inputs(success, cost, group, key, competence) -> tuple[np.ndarray, ...]:
    success = np.asarray(success, bool)
    n = success.shape[0]
    arrays = [success]
    for name, arr, dtype in (("cost", cost, np.float64), ("group", group, np.int64), ("key", key, np.int64),
                             ("competence", competence, np.float64)):
        a = np.asarray(arr, dtype)
        if a.shape != (n,):
            raise ValueError(f"advantages: {name} has shape {a.shape}, expected ({n},) like success")
        if dtype is np.float64 and not np.all(np.isfinite(a)):
            raise ValueError(f"advantages: {name} has non-finite values")
        arrays.append(a)
    if np.any(arrays[1] < 0):
        raise ValueError("advantages: cost must be >= 0")
    return tuple(arrays)


def rewards(*, success, cost, key, competence, cfg: Any, group=None) -> np.ndarray:
    """The per-rollout reward (see the module docstring); vanilla: success as 0/1. `group` (default: one
    group) decides where the opt-in failure term applies: only in groups that have a success."""
    group = np.zeros(len(success)) if group is None else group
    success, cost, group, key, competence = _check_inputs(success, cost, group, key, competence)
    r = success.astype(np.float64)
    if str(cfg.algo) == "vanilla":
        return r
    lam = lambda_schedule(competence, cfg)
    sharp = float(cfg.cost_sharpness)
    r = np.where(success, 1.0 - lam * normalised_cost(success, cost, key, sharp), 0.0)
    f = float(cfg.failure_cost)
    if f > 0:
        priced = ~success & np.isin(group, group[success])
        fail_hat = normalised_cost(~success, cost, key, sharp)
        r = np.where(priced, -f * lam * (1.0 + fail_hat) / 2.0, r)
    return r


def advantages(*, success, cost, group, key, competence, cfg: Any) -> np.ndarray:
    """Per-rollout advantages [N] (float64) for CARE or vanilla; see the module docstring."""
    check_rl_config(cfg)
    success, cost, group, key, competence = _check_inputs(success, cost, group, key, competence)
    care = str(cfg.algo) == "care"
    r = rewards(success=success, cost=cost, key=key, competence=competence, cfg=cfg, group=group)
    neg_scale = float(cfg.negative_scale)
    adv = np.zeros(r.shape, np.float64)
    for g in np.unique(group):
        sel = group == g
        rg = r[sel]
        if rg.std() <= 1e-12 * max(1.0, float(np.abs(rg).max())):
            continue  # no variance: no signal (zeros)
        # the task outcome's std: vanilla's scale in mixed groups; none in all-success groups (module docstring)
        s_std = success[sel].astype(np.float64).std()
        adv[sel] = (rg - rg.mean()) / (s_std + _EPS if s_std > 0 else 1.0)
        if neg_scale < 1.0:
            adv[sel] = _damp_failures(adv[sel], success[sel], neg_scale)
    if care:
        amp = 1.0 + float(cfg.beta) * (1.0 - np.clip(competence, 0.0, 1.0))
        adv = np.where(success & (adv > 0), adv * amp, adv)
        clip = float(cfg.adv_clip)
        adv = clip * np.tanh(adv / clip)
    return adv


def _damp_failures(adv: np.ndarray, success: np.ndarray, scale: float) -> np.ndarray:
    """One group's failure advantages pulled towards min(0, lowest success advantage) by `scale`.

    Why: a failure's whole sequence is pushed down, its correct formatting and the steps after its one
    mistake included, which a small model generalises into broken replies elsewhere; `scale` 0 learns
    from the group's successes only (advantage-weighted rejection sampling). The anchor sits just
    under the lowest success so that every success still outranks every failure (CARE's costly
    successes can be below the group mean)."""
    if not success.any() or success.all():
        return adv
    anchor = min(0.0, float(adv[success].min()) - 1e-6)
    fail = ~success
    out = adv.copy()
    out[fail] = np.where(adv[fail] < anchor, anchor + scale * (adv[fail] - anchor), adv[fail])
    return out


def zero_variance_groups(group: np.ndarray, adv: np.ndarray) -> int:
    """Number of groups whose advantages are all zero (no learning signal)."""
    group = np.asarray(group)
    return int(sum(1 for g in np.unique(group) if not np.any(np.asarray(adv)[group == g] != 0)))


def group_has_signal(*, success, cost, competence, cfg: Any) -> bool:
    """Whether one group (its rollouts' outcomes, costs and key competence) carries a gradient under CARE's reward
    or vanilla's, whatever `cfg.algo` is: the matched-arms selection rule (module docstring). An all-success group
    has one under CARE only where lambda(c_k) > 0 and its costs differ; an all-failure group never has one."""
    success = np.asarray(success, bool)
    if success.size < 2:
        return False
    if success.any() and not success.all():
        return True  # vanilla's reward varies (and so does CARE's: every success outranks every failure)
    care_cfg = _as_algo(cfg, "care")
    r = rewards(success=success, cost=cost, key=np.zeros(success.size, np.int64), competence=competence, cfg=care_cfg)
    return bool(r.std() > 1e-12 * max(1.0, float(np.abs(r).max())))


def _as_algo(cfg: Any, algo: str) -> Any:
    """`cfg` with `algo` set (a copy; ConfigDicts and plain mappings)."""
    import copy

    out = copy.deepcopy(cfg)
    out.algo = algo
    return out
