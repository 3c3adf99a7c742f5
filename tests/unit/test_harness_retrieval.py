"""Catalog tool retrieval (recall of gold tools on a held-out split, the bench script) and the schema
normalisers (pure functions)."""
from __future__ import annotations

import importlib.util
import json
import os

from mpa_jax.envs import load_tasks, tools_used
from mpa_jax.harness.normalise import normalise_arguments, schema_hint
from mpa_jax.harness.retrieval import catalog_index, learn_companions, request_query

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_catalog_retrieval_recall_on_dev():
    index = catalog_index()
    assert len(index.names) >= 257
    # follow-up conversations name their later tools only in later user turns (retrieved at that turn), so the
    # first request's recall is measured on single-request tasks
    tasks = [t for t in load_tasks("dev") if t.category != "followup"]
    hit = total = 0
    for t in tasks:
        got = index.search(request_query([*t.history, {"role": "user", "content": t.instruction}]), 8)
        assert len(got) == 8 == len(set(got))
        gold = tools_used([t])
        hit += len(gold & set(got))
        total += len(gold)
    assert hit / total >= 0.95, hit / total
    # Tools already in use are kept first; an allow-list filters.
    got = index.search("convert 5 km to miles", 4, keep=["send_sms"], allowed={"send_sms", "convert_units", "calculate"})
    assert got[0] == "send_sms" and set(got) <= {"send_sms", "convert_units", "calculate"} and "convert_units" in got


def test_learned_companions_need_support():
    plans = [["search_contacts", "send_sms"]] * 3 + [["send_sms"]]
    comps = learn_companions(plans, min_p=0.5, min_count=3)
    assert comps["search_contacts"] == ["send_sms"] and comps["send_sms"] == ["search_contacts"]
    assert learn_companions(plans[:2], min_count=3) == {}


def test_bench_tool_retrieval_runs(capsys):
    spec = importlib.util.spec_from_file_location("tool_retrieval", os.path.join(REPO, "bench", "tool_retrieval.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--split", "dev", "--max-tasks", "150", "--ks", "5,8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 150 and set(out["recall"]) == {"5", "8"} and out["recall"]["8"] >= out["recall"]["5"]
    assert out["latency_ms"]["mean"] > 0 and out["catalog_tools"] >= 257


def test_schema_normalisers_and_rewrites():
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
        "rel": {"type": "string", "enum": ["friend", "colleague"]}, "s": {"type": "string"}}, "required": ["n"]}
    args, changes = normalise_arguments({"n": " 3", "x": "2.5", "b": "TRUE", "rel": "Friend", "s": "  hi "}, schema)
    assert args == {"n": 3, "x": 2.5, "b": True, "rel": "friend", "s": "hi"} and len(changes) == 5
    # Values it cannot make sense of are left for the tool to reject (never invented).
    args, changes = normalise_arguments({"n": "three", "rel": "boss", "x": "nan"}, schema)
    assert args == {"n": "three", "rel": "boss", "x": "nan"} and changes == []
    args, changes = normalise_arguments('{"n": 1}', schema)
    assert args == {"n": 1} and changes
    rules = [{"tool": "t", "arg": "rel", "from": "coworker", "to": "colleague"}]
    assert normalise_arguments({"rel": "Coworker"}, schema, rules, "t")[0] == {"rel": "colleague"}
    assert normalise_arguments({"rel": "coworker"}, schema, rules, "other")[0] == {"rel": "coworker"}
    assert schema_hint(schema).startswith("required n: integer; optional x: number")
