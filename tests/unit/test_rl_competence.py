"""CARE's competence table (mpa_jax.rl.competence): back-off key -> cell -> global, evidence weighting,
decay by episodes, seeding from trajectories and the round trip through the RL checkpoint's `extra` JSON."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mpa_jax.rl.competence import CompetenceTable, keys_of_trajectory


def table(**kw) -> CompetenceTable:
    return CompetenceTable(**{"window": 1e9, "prior": 4.0, "init": 0.5, **kw})


def test_an_unseen_key_is_its_cells_value_and_an_unseen_cell_the_global_value():
    t = table()
    assert t.get("a#1", "d/x/1") == pytest.approx(0.5)  # no evidence anywhere: the prior
    t.update(["a#1"] * 4, ["d/x/1"] * 4, [1, 1, 1, 1])  # key a, cell d/x/1: 4 successes
    t.update(["b#1"] * 4, ["e/y/1"] * 4, [0, 0, 0, 0])  # another cell: 4 failures
    g = (4 + 4 * 0.5) / (8 + 4)
    assert t.global_value == pytest.approx(g)
    cell = (4 + 4 * g) / (4 + 4)
    assert t.cell_value("d/x/1") == pytest.approx(cell)
    # a template never seen, in a seen cell, is that cell's value, not the global one
    assert t.get("new#1", "d/x/1") == pytest.approx(cell) and not t.has_own("new#1")
    assert t.get("new#1", "z/z/3") == pytest.approx(g)
    assert t.get("a#1", "d/x/1") == pytest.approx((4 + 4 * cell) / (4 + 4)) and t.has_own("a#1")
    assert t.get("a#1", "d/x/1") > cell > g > t.cell_value("e/y/1")


def test_evidence_weighting_a_key_with_more_episodes_moves_further_from_its_cell():
    t = table()
    t.update(["few#1"] * 2, ["c/c/1"] * 2, [1, 1])
    t.update(["many#1"] * 40, ["c/c/1"] * 40, [1] * 40)
    t.update(["bad#1"] * 42, ["c/c/1"] * 42, [0] * 42)  # the cell is half successes
    cell = t.cell_value("c/c/1")
    few, many = t.get("few#1", "c/c/1"), t.get("many#1", "c/c/1")
    assert cell < few < many <= 1.0
    # weights: own rate with n / (n + prior), parent with prior / (n + prior)
    assert few == pytest.approx((2 / 6) * 1.0 + (4 / 6) * cell)
    assert many == pytest.approx((40 / 44) * 1.0 + (4 / 44) * cell)
    assert t.evidence("many#1") == 40 and t.evidence("never#1") == 0


def test_decay_is_by_the_entrys_own_episodes_and_updates_are_order_independent():
    t = table(window=10.0)
    t.update(["a#1"] * 10, ["c/c/1"] * 10, [1] * 10)
    before = list(t.tally["key"]["a#1"])
    # 100 episodes of other keys (in another cell) do not age key a's evidence: decay counts a's own episodes
    t.update(["b#1"] * 100, ["d/d/1"] * 100, [0] * 100)
    assert t.tally["key"]["a#1"] == before
    # 10 new episodes of a: its old tally is kept with weight 0.9^10
    t.update(["a#1"] * 10, ["c/c/1"] * 10, [0] * 10)
    s, n = t.tally["key"]["a#1"]
    assert s == pytest.approx(10 * 0.9 ** 10) and n == pytest.approx(10 * 0.9 ** 10 + 10)
    u = table(window=10.0)
    u.update(["b#1"] * 100, ["d/d/1"] * 100, [0] * 100)
    u.update(["a#1"] * 10, ["c/c/1"] * 10, [1] * 10)
    u.update(["a#1"] * 10, ["c/c/1"] * 10, [0] * 10)
    assert u.tally["key"]["a#1"] == pytest.approx(t.tally["key"]["a#1"])
    w = table()
    w.update(["x#1", "y#2", "x#1"], ["c/c/1", "c/c/2", "c/c/1"], [1, 0, 0])
    v = table()
    v.update(["x#1", "x#1", "y#2"], ["c/c/1", "c/c/1", "c/c/2"], [0, 1, 0])
    assert v == w


def test_round_trip_through_the_checkpoint_extra_json_and_old_tables_are_named():
    t = table(window=32.0)
    t.update(["a#1", "a#1", "b#2"], ["c/c/1", "c/c/1", "c/d/2"], [1, 0, 1])
    d = json.loads(json.dumps(t.to_dict()))  # what orbax's JSON extra stores
    u = CompetenceTable.from_dict(d)
    assert u == t and u.get("a#1", "c/c/1") == t.get("a#1", "c/c/1") and u.get("zz#9", "c/d/2") == t.get("zz#9", "c/d/2")
    # the resumed table continues exactly like the original
    t.update(["b#2"] * 3, ["c/d/2"] * 3, [0, 0, 1])
    u.update(["b#2"] * 3, ["c/d/2"] * 3, [0, 0, 1])
    assert u == t
    with pytest.raises(ValueError, match="format 1"):
        CompetenceTable.from_dict({"alpha": 0.1, "values": {}, "global": 0.0})
    with pytest.raises(ValueError, match="competence_window"):
        CompetenceTable(window=0.5, prior=1.0, init=0.0)
    with pytest.raises(ValueError, match="competence_prior"):
        CompetenceTable(window=8, prior=0.0, init=0.0)


def test_seeded_from_probe_trajectories_by_template_and_cell():
    from envs.contract import Trajectory, Verification

    def traj(template, domain, category, difficulty, ok, infra=False):
        return Trajectory(task_id=f"t/{template}", tokens=[], loss_mask=[], logprobs=[], steps=[],
                          verification=None if infra else Verification(success=ok, score=float(ok), checks=[]),
                          infra_failure=infra,
                          provenance={"template": template, "domain": domain, "category": category, "difficulty": difficulty})

    probe = [traj("calc.tip_split", "calculator", "tool_use", 1, True), traj("calc.tip_split", "calculator", "tool_use", 1, True),
             traj("calc.other", "calculator", "tool_use", 1, False), traj("calc.tip_split", "calculator", "tool_use", 1, False, infra=True)]
    assert keys_of_trajectory(probe[0]) == ("calc.tip_split#1", "calculator/tool_use/1")
    t = table()
    assert t.seed(probe) == 3  # the infra episode is not the policy's
    assert t.evidence("calc.tip_split#1") == 2 and t.get("calc.tip_split#1", "calculator/tool_use/1") > t.get("calc.other#1", "calculator/tool_use/1")
    assert np.isclose(t.tally["cell"]["calculator/tool_use/1"][1], 3)
