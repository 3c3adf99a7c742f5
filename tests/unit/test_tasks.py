"""The benchmark: size and coverage, the quality gate, splits, determinism, the seed scenario and `mpa tasks`."""
import collections
import copy
import json
import random

import pytest

from mpa_jax import cli
from mpa_jax.envs import CATEGORIES, DOMAINS, Action, ErrorCode, generate_split, load_tasks, make_env, tools_used
from mpa_jax.envs.benchmark import PERSONAS, templates_for
from mpa_jax.envs.gate import check_task
from mpa_jax.envs.taskgen import TEMPLATES


@pytest.fixture(scope="module")
def test_split():
    return load_tasks("test")  # generated once, then served from the on-disk cache


def test_benchmark_size_and_coverage(test_split):
    assert len(test_split) >= 1700
    assert len(tools_used(test_split)) >= 200
    counts = collections.Counter((t.domain, t.category) for t in test_split)
    missing = [(d, c) for d in DOMAINS for c in CATEGORIES if counts[(d, c)] == 0]
    assert not missing
    assert len({t.id for t in test_split}) == len(test_split)
    assert all(t.split == "test" and t.gold for t in test_split)
    # hard variants are all there
    assert any(t.faults for t in test_split)
    assert any(t.initial_state.get("device", {}).get("airplane_mode") for t in test_split)
    assert any(t.verifier.get("answer", {}).get("kind") == "ask" for t in test_split)
    assert any(t.verifier.get("answer", {}).get("kind") == "refuse" for t in test_split)
    assert any(t.roles for t in test_split) and any(t.history for t in test_split)
    assert len({t.metadata.get("skill") for t in test_split if t.category == "skills"}) >= 3
    assert any(len(t.metadata["apps"]) >= 2 for t in test_split)  # multi-app chains
    assert any(len(t.tools) > len({s.get("name") for s in t.gold}) for t in test_split)  # distractor tools


def test_a_sample_of_the_test_split_passes_the_gate_again(test_split):
    env = make_env("sandbox")
    for t in random.Random(0).sample(test_split, 120):
        assert check_task(t, env) is None, t.id
    env.close()


def test_generation_is_deterministic_and_the_cache_is_faithful(test_split):
    names = [t.name for t in TEMPLATES[::40]] + ["seed.coach_70kg"]
    a = generate_split("test", templates=names)
    b = generate_split("test", templates=names)
    assert [t.to_json() for t in a] == [t.to_json() for t in b]
    cached = [t.to_json() for t in test_split if t.template in set(names)]
    assert sorted(cached) == sorted(t.to_json() for t in a)


def test_splits_are_separated_by_seed_persona_and_template():
    held = [t for t in TEMPLATES if t.held_out]
    assert held and all(t not in templates_for("train") for t in held)
    names = [t.name for t in held[:6]] + [t.name for t in TEMPLATES[::60]]
    train = generate_split("train", templates=names, per_template=1)
    dev = generate_split("dev", templates=names, per_template=1)
    assert train and dev
    assert not {t.template for t in train} & {t.name for t in held}
    assert {t.persona_seed for t in train} <= set(PERSONAS["train"]) and {t.persona_seed for t in dev} <= set(PERSONAS["dev"])
    assert not set(PERSONAS["train"]) & set(PERSONAS["test"])
    assert not {t.seed for t in train} & {t.seed for t in dev}


def test_gate_rejects_broken_tasks(test_split):
    create = next(t for t in test_split if t.template == "note.create")
    no_goal = copy.deepcopy(next(t for t in test_split if t.template == "note.lookup"))
    no_goal.verifier = {"goals": []}
    assert check_task(no_goal) == "doing nothing passes"
    too_loose = copy.deepcopy(create)
    too_loose.verifier = {"goals": [{"kind": "new_row", "entity": "note", "match": {}}]}
    assert "corrupted solution" in check_task(too_loose)
    broken_gold = copy.deepcopy(create)
    broken_gold.gold = broken_gold.gold[-1:]
    assert check_task(broken_gold).startswith("gold fails")
    update = next(t for t in test_split if t.template == "note.update")
    peeking = copy.deepcopy(update)
    peeking.gold = [s for s in peeking.gold if not s.get("name", "").startswith("search_")]
    assert "before the planner could see it" in check_task(peeking)


def test_seed_scenario(test_split):
    seeds = [t for t in test_split if t.template == "seed.coach_70kg"]
    assert seeds
    t = seeds[0]
    assert t.instruction == "Convert 70 kg to pounds and text it to my coach."
    env = make_env("sandbox")
    obs = env.reset(t)
    history = " ".join(m["content"] for m in obs["messages"][1:-1])
    coach_id = next(g for g in t.verifier["goals"] if g["kind"] == "new_row")["match"]["to_number"]
    contacts = env.step(Action.tool_call("search_contacts", {"query": " "}))  # any planner could list contacts
    assert contacts.ok
    coach_name = next(s["arguments"]["query"] for s in t.gold if s.get("name") == "search_contacts")
    assert f"{coach_name} is your coach" in history and "coach" not in coach_name.lower()
    for unit in ("kg", "kilograms"):
        fb = env.step(Action.tool_call("convert_units", {"value": 70, "from_unit": unit, "to_unit": "lb"}))
        assert fb.error_code == ErrorCode.UNSUPPORTED_VALUE and "calculate" in fb.hint
    calc = env.step(Action.tool_call("calculate", {"expression": "70 * 2.20462"}))
    assert round(calc.result["result"], 2) == 154.32
    hit = env.step(Action.tool_call("search_contacts", {"query": coach_name})).result["results"][0]
    assert hit["phone"] == coach_id
    assert env.step(Action.tool_call("send_sms", {"to": hit["id"], "body": "70 kg is 154.32 lb"})).ok
    env.step(Action.message("70 kg is 154.32 lb; sent to your coach."))
    assert env.verify().success
    # the same text to someone else fails
    env.reset(t)
    other = "contact_2" if hit["id"] != "contact_2" else "contact_3"
    env.step(Action.tool_call("send_sms", {"to": other, "body": "70 kg is 154.32 lb"}))
    env.step(Action.message("70 kg is 154.32 lb."))
    assert not env.verify().success
    env.close()


def test_mpa_tasks_cli(tmp_path, capsys):
    out = tmp_path / "dev.jsonl"
    rc = cli.main(["tasks", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"), "--split", "dev", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "communication" in printed and "subagent" in printed and "total" in printed
    lines = out.read_text().splitlines()
    assert len(lines) == len(load_tasks("dev")) and json.loads(lines[0])["split"] == "dev"
    assert load_tasks(str(out))[0].to_json() == lines[0]
    assert cli.main(["tasks", "--workdir", str(tmp_path / "run"), "--split", "nope"]) == 2
    assert "--split must be one of" in capsys.readouterr().err
