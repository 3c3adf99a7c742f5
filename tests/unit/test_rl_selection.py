"""Competence-aware task selection (`rl.selection = "competence"`, rl/tasks.py, rl/worker.py): fresh instances whose
seeds collide with no split's, held-out templates never drawn, weights highest at intermediate competence as
CARE's competence table says (the one source: no counts of the selector's own), and a group without reward
variance never reaches the learner (the step draws again, within its tries), by the matched-arms rule of
`rl/advantage.py` (the same groups whatever `rl.algo`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs import load_tasks
from mpa_jax.envs.contract import Trajectory, Verification
from mpa_jax.eval import held_out_templates
from mpa_jax.rl.advantage import Care
from mpa_jax.rl.competence import CompetenceTable, keys_of_template
from mpa_jax.rl.errors import RLSetupError
from mpa_jax.rl.tasks import FRESH_SEED_BASE, Selector, TaskSource
from mpa_jax.rl.worker import RolloutWorker


def _config(**rl):
    c = load_config_file("configs/tiny.py")
    c.rl.selection, c.rl.tasks_per_step, c.rl.group_size = "competence", 4, 3
    for k, v in rl.items():
        c.rl[k] = v
    return c


def _traj(task, ok: bool, tokens: float = 10.0) -> Trajectory:
    return Trajectory(task_id=task.id, tokens=[], loss_mask=[], logprobs=[], steps=[], verification=Verification(ok, float(ok)),
                      costs={"output_tokens": tokens, "tool_calls": 1.0}, provenance={"template": task.template})


def _selector(cfg) -> Selector:
    return Selector(cfg.rl, int(cfg.seed), int(cfg.tasks.seed))


def _source(cfg) -> TaskSource:
    return TaskSource(cfg.rl, cfg.envs, cfg.tasks, int(cfg.seed))


def _table(cfg) -> CompetenceTable:
    return CompetenceTable.from_config(cfg.rl)


def _keep(cfg):
    """The matched-arms keep rule of a fresh run (competence table at its prior)."""
    return Care(cfg.rl, _table(cfg)).keep_rule()


def _collect(source, runner, cfg, step=0, care=None):
    worker = RolloutWorker(source, runner, None, None, rl=cfg.rl, rollout=cfg.rollout, seed=int(cfg.seed))
    return worker.collect(step, (care or Care(cfg.rl, _table(cfg))).selection())


def _evidence(table, template: str, successes: int, episodes: int) -> None:
    """Fold `episodes` outcomes of `template` (the first `successes` of them successes) into `table`."""
    from mpa_jax.envs.benchmark import templates_for

    t = next(t for t in templates_for("train") if t.name == template)
    key, cell = keys_of_template(t)
    table.update([key] * episodes, [cell] * episodes, [1.0] * successes + [0.0] * (episodes - successes))


class _Runner:
    """Stands in for the episode runner (the rollouts' outcomes are what is under test): an episode succeeds
    when `outcome(task, i)` says so, i = its index within the call."""

    def __init__(self, outcome):
        self.outcome, self.calls, self.samples = outcome, [], []

    def run(self, engine, tok, tasks, cfg, kinds=None, samples=None):
        self.calls.append([t.id for t in tasks])
        self.samples.append(list(samples))
        return [_traj(t, self.outcome(t, i)) for i, t in enumerate(tasks)]


def test_fresh_instances_never_collide_with_the_benchmark_and_never_use_held_out_templates():
    cfg = _config()
    sel = _selector(cfg)
    tasks = sel.draw(step=0, attempt=0, n=40, table=_table(cfg)) + sel.draw(step=1, attempt=0, n=40, table=_table(cfg))
    bench = {(t.template, t.seed) for s in ("train", "dev", "test") for t in load_tasks(s)}
    bench_seeds = {t.seed for s in ("train", "dev", "test") for t in load_tasks(s)}
    assert len(tasks) == 80 and len({t.id for t in tasks}) == 80
    assert all(t.seed >= FRESH_SEED_BASE > max(bench_seeds) for t in tasks)
    assert not {(t.template, t.seed) for t in tasks} & bench
    assert not {t.template for t in tasks} & held_out_templates()
    assert all(t.split == "train" for t in tasks)
    with pytest.raises(RLSetupError, match="held-out or unknown"):
        _selector(_config(templates=sorted(held_out_templates())[0]))


def test_weights_favour_intermediate_competence_as_the_competence_table_says():
    cfg = _config(templates="calc.tip_split,contact.create,weather.forecast")
    sel, table = _selector(cfg), _table(cfg)
    _evidence(table, "calc.tip_split", 40, 40)
    _evidence(table, "contact.create", 10, 20)
    _evidence(table, "weather.forecast", 0, 40)
    w = dict(zip([t.name for t in sel.templates], sel.weights(table)))
    assert w["contact.create"] > 0.9 and w["calc.tip_split"] < 0.3 and w["weather.forecast"] < 0.3
    tip = next(t for t in sel.templates if t.name == "calc.tip_split")
    assert sel.competence(table)["calc.tip_split"] == pytest.approx(table.get(*keys_of_template(tip)))
    draws = [t.template for t in sel.draw(0, 0, 60, table)]
    assert draws.count("contact.create") > draws.count("calc.tip_split") + draws.count("weather.forecast")


def test_the_competence_table_is_the_selectors_one_source():
    """The selector keeps no counts of its own: a template without evidence of its own draws by its cell's value
    (the table's back-off), the same snapshot prices the keep rule and weights the step's draws, and the step's
    outcomes (kept and left-out groups) reach the table through `Care.observe` only, after the step."""
    cfg = _config(templates="calc.tip_split,contact.create")
    sel, table = _selector(cfg), _table(cfg)
    assert set(sel.state) == {"drawn"}
    fresh = {t.name: sel.competence(table)[t.name] for t in sel.templates}
    assert fresh == {"calc.tip_split": 0.5, "contact.create": 0.5}  # rl.competence_init, no evidence anywhere
    tip = next(t for t in sel.templates if t.name == "calc.tip_split")
    key, cell = keys_of_template(tip)
    table.update([f"other.template#{tip.difficulty}"] * 30, [cell] * 30, [1.0] * 30)  # evidence in calc.tip_split's cell only
    assert not table.has_own(key) and table.cell_value(cell) > 0.9
    assert sel.competence(table)["calc.tip_split"] == pytest.approx(table.cell_value(cell))
    care = Care(cfg.rl, _table(cfg))
    plan = care.selection()
    runner = _Runner(lambda t, i: i % 3 == 0)
    r = RolloutWorker(_source(cfg), runner, None, None, rl=cfg.rl, rollout=cfg.rollout, seed=int(cfg.seed)).collect(0, plan)
    assert care.table == plan.competence  # sampling changed nothing: the table moves when the step is observed
    care.observe(r)
    seen = {t.provenance["competence_key"] for t in r.trajs + r.unused}
    assert seen == set(care.table.tally["key"]) and care.table != plan.competence
    with pytest.raises(ValueError, match="competence"):
        _source(cfg).draw(0, 2)  # selection without the table is refused, not drawn from stale counts


def test_unanimous_groups_are_never_kept_and_the_step_draws_again_within_its_tries():
    cfg = _config(templates="calc.tip_split,contact.create", select_tries=3)
    source = _source(cfg)
    # contact.create: one success per group of 3 (signal); calc.tip_split: every rollout succeeds (none)
    runner = _Runner(lambda t, i: t.template == "calc.tip_split" or i % 3 == 0)
    care = Care(cfg.rl, _table(cfg))
    r = _collect(source, runner, cfg, care=care)
    assert all(_keep(cfg)(r, g) for g in range(len(r.draws)))
    assert all(t.template == "contact.create" for _, t in r.draws) and len(r.draws) <= 4
    assert r.drawn == sum(len(c) for c in runner.calls) // 3 and r.drawn <= 4 * 3
    assert all(r.trajs[i].task_id == r.draws[g][1].id for i, g in enumerate(r.groups))
    # what every drawn group showed reaches the table (kept or not)
    care.observe(r)
    s, n = care.table.tally["key"][next(t.provenance["competence_key"] for t in r.unused if t.provenance["template"] == "calc.tip_split")]
    assert n > 0 and s == n
    # no group has signal: the step ends after its tries with nothing to train on
    nothing = _collect(_source(cfg), _Runner(lambda t, i: True), cfg)
    assert nothing.draws == [] and nothing.trajs == [] and nothing.drawn == 12
    # ... but the groups left out keep their episodes (saved with the step's rollouts: outcomes for the next
    # data stage, failure traces for the harness), through a checkpoint's round trip too
    assert len(nothing.unused) == 12 * 3 and len(r.unused) == 3 * (r.drawn - len(r.draws))
    from mpa_jax.rl.rollouts import Rollouts

    back = Rollouts.from_dict(r.to_dict())
    assert [t.task_id for t in back.unused] == [t.task_id for t in r.unused] and back.groups == r.groups


def test_both_arms_keep_all_success_groups_whose_costs_differ_where_lambda_of_the_key_is_positive():
    """Matched arms: an all-success group with distinct costs has signal under CARE's reward, so both arms keep it
    (the vanilla arm trains on it with zero advantages); only where lambda(c_k) > 0 (the old rule asked
    rl.lambda_max > 0 and kept such groups below c_lo with all-zero advantages)."""
    task = load_tasks("train")[0]
    from mpa_jax.rl.rollouts import Rollouts

    r = Rollouts(0, [("sandbox", task)], [_traj(task, True, 10.0), _traj(task, True, 30.0)], [0, 0], {}, 0.0)
    for algo in ("care", "vanilla"):
        cfg = _config(algo=algo, lambda_max=0.5, c_lo=0.3, c_hi=0.8, competence_init=0.6)
        assert _keep(cfg)(r, 0), algo
        low = _config(algo=algo, lambda_max=0.5, c_lo=0.3, c_hi=0.8, competence_init=0.1)  # lambda(0.1) = 0
        assert not _keep(low)(r, 0), algo


def test_selection_state_round_trips():
    cfg = _config()
    table = _table(cfg)
    a = _source(cfg)
    a.draw(0, 4, competence=table)
    table.seed([_traj(t, True) for _, t in a.draw(1, 4, competence=table)])
    b = _source(cfg)
    b.restore(json.loads(json.dumps(a.state)))
    assert b.state == a.state
    back = CompetenceTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert [t.id for _, t in b.draw(2, 4, competence=back)] == [t.id for _, t in a.draw(2, 4, competence=table)]


def test_fresh_worlds_are_persona_worlds_of_no_split():
    """`rl.select_worlds`: the selected instances are set in worlds no split uses (the dev and test worlds stay
    unseen); without it they are in the train split's worlds, as the benchmark's train tasks are."""
    from mpa_jax.envs.benchmark import FRESH_PERSONA_BASE, PERSONAS

    split_worlds = {w for ws in PERSONAS.values() for w in ws}
    assert FRESH_PERSONA_BASE > max(split_worlds)
    fresh = _selector(_config(select_worlds=32)).draw(0, 0, 40, _table(_config()))
    assert {t.persona_seed for t in fresh} <= set(range(FRESH_PERSONA_BASE, FRESH_PERSONA_BASE + 32))
    assert len({t.persona_seed for t in fresh}) > 10
    assert {t.persona_seed for t in _selector(_config()).draw(0, 0, 40, _table(_config()))} <= set(PERSONAS["train"])
    # a fresh world is a complete world: the task runs and its gold plan passes the verifier (the gate)
    from mpa_jax.envs.gate import check_task
    from mpa_jax.envs.sandbox import SandboxEnv

    env = SandboxEnv()
    try:
        assert all(check_task(t, env) is None for t in fresh)
    finally:
        env.close()
    with pytest.raises(RLSetupError, match="config.rl.select_worlds"):
        _selector(_config(select_worlds=-2))


def test_rl_samples_key_a_task_twice_drawn_apart_and_survive_a_retry():
    """Issue 55 item 5: RL passes the runner each episode's sample index (its task's occurrence count over the step's
    episodes), so a task drawn in two groups of one step gets distinct seeds, and an infra retry keeps the samples."""
    import dataclasses

    from mpa_jax.rl.rollouts import group_rollouts

    cfg = _config()
    a, b = load_tasks("train")[:2]
    runner = _Runner(lambda t, i: True)
    first = runner.run

    def flaky(engine, tok, tasks, c, kinds=None, samples=None):
        out = first(engine, tok, tasks, c, kinds, samples)
        if len(runner.calls) == 1:  # the first attempt loses its second episode to infra
            out[1] = dataclasses.replace(out[1], infra_failure=True)
        return out

    runner.run = flaky
    rl = cfg.rl.copy_and_resolve_references()
    rl.group_size, rl.infra_retries = 2, 1
    ro = group_rollouts(runner, None, None, [("sandbox", a), ("sandbox", b), ("sandbox", a)], rl=rl, rollout=cfg.rollout,
                        seed=int(cfg.seed), step=0)
    assert runner.calls[0] == [a.id, a.id, b.id, b.id, a.id, a.id]
    assert runner.samples[0] == [0, 1, 0, 1, 2, 3]
    assert runner.calls[1] == [a.id] and runner.samples[1] == [1]  # the retried episode keeps its sample
    assert len(ro.trajs) == 6 and sorted(ro.groups) == [0, 0, 1, 1, 2, 2]
