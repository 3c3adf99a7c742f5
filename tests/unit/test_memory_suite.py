"""BEAM-style suites: determinism, answers from the generator's state, eval layout, the CLI."""
from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from mpa_jax.harness.memory.evaluate import (ScriptedReader, evaluate_suite, evidence_recall, score_answer,
                                             write_report)
from mpa_jax.harness.memory.suite import ABILITIES, parse_size, read_history, read_meta, read_questions, write_suite

TOKENS = 30_000


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("suite") / "s")
    write_suite(d, TOKENS, seed=3, per_ability=6, paraphrase=0.0)
    return d


def _bytes(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in ("history.jsonl", "questions.jsonl", "meta.json")}


def test_suite_is_deterministic_and_seeded(suite, tmp_path):
    write_suite(str(tmp_path / "again"), TOKENS, seed=3, per_ability=6, paraphrase=0.0)
    assert _bytes(str(tmp_path / "again")) == _bytes(suite)
    write_suite(str(tmp_path / "other"), TOKENS, seed=4, per_ability=6, paraphrase=0.0)
    assert _bytes(str(tmp_path / "other"))["history.jsonl"] != _bytes(suite)["history.jsonl"]


def test_suite_shape_and_size(suite):
    meta = read_meta(suite)
    turns = list(read_history(suite))
    assert TOKENS <= meta["tokens"] < TOKENS * 1.05 and meta["turns"] == len(turns)
    assert [t["id"] for t in turns] == list(range(1, len(turns) + 1))
    assert [t["ts"] for t in turns] == sorted(t["ts"] for t in turns)  # time moves forward
    assert len({t["session"] for t in turns}) == meta["sessions"] > 50
    qs = read_questions(suite)
    assert {q["ability"] for q in qs} == set(ABILITIES) and len(qs) == meta["questions"]
    assert all(q["ability"] == "abstention" or q["evidence"] for q in qs)


def test_answers_come_from_the_planted_turns(suite):
    by_id = {t["id"]: t for t in read_history(suite)}
    text = "\n".join(t["content"] for t in by_id.values())
    for q in read_questions(suite):
        ev = [by_id[i] for i in q["evidence"]]
        assert all(t["role"] == "user" for t in ev)
        subj = q["reader"]["subject"]
        if q["ability"] == "abstention":
            assert subj not in text  # the asked-about name was never said
        elif q["ability"] in ("information_extraction", "knowledge_update"):
            assert q["answer"] in ev[-1]["content"]
        elif q["ability"] == "temporal_reasoning":
            d0, d1 = (dt.date.fromisoformat(t["ts"][:10]) for t in ev)
            assert q["answer"] == (d1 - d0).days >= 0
        elif q["ability"] == "event_ordering":
            assert [s for t in ev for s in q["answer"] if s in t["content"]] == q["answer"]
        elif q["ability"] == "summarization":
            assert all(any(k in t["content"] for t in ev) for k in q["key_points"])
        elif q["ability"] == "multi_session_reasoning" and not q["reader"].get("sum"):
            assert q["answer"] == len(ev)
    # knowledge updates: the evidence is the newest statement of the attribute
    for q in read_questions(suite):
        if q["ability"] == "knowledge_update":
            mentions = [t for t in by_id.values() if t["role"] == "user" and q["reader"]["subject"] + " is" in t["content"].lower()]
            assert mentions[-1]["id"] == q["evidence"][0]


def test_paraphrased_questions_avoid_the_history_words(tmp_path):
    """Paraphrased questions are the ones a lexical index cannot bridge: the report splits recall by wording."""
    d = str(tmp_path / "p")
    write_suite(d, TOKENS, seed=3, per_ability=6, paraphrase=1.0)
    qs = read_questions(d)
    para = [q for q in qs if q["paraphrased"]]
    assert {q["ability"] for q in para} == {"knowledge_update", "instruction_following", "preference_following"}
    assert all(q["reader"]["subject"].split()[-1] not in q["question"].lower() for q in para)
    rep = evaluate_suite(d, budget_tokens=1024)
    assert rep["by_wording"]["paraphrased"]["questions"] == len(para) == 18
    assert rep["by_wording"]["literal"]["memory"] == 1.0 > rep["by_wording"]["paraphrased"]["memory"]
    with pytest.raises(ValueError, match="paraphrase"):
        write_suite(d, TOKENS, paraphrase=1.5)


def test_parse_size():
    assert parse_size("100k") == 100_000 and parse_size("10m") == 10_000_000 and parse_size("250000") == 250_000
    with pytest.raises(ValueError, match="--tokens"):
        parse_size("lots")


def test_score_answer():
    q = {"answer_kind": "exact", "answer": "level 3 spot 168"}
    assert score_answer(q, "It is level 3 spot 168.") == 1.0 and score_answer(q, "level 3 spot 16") == 0.0
    assert score_answer({"answer_kind": "number", "answer": 12}, "12 days") == 1.0
    assert score_answer({"answer_kind": "number", "answer": 12}, "about 11") == 0.0
    order = {"answer_kind": "order", "answer": ["a b", "c d"]}
    assert score_answer(order, "a b, then c d") == 1.0 and score_answer(order, "c d, a b") == 0.0
    assert score_answer({"answer_kind": "keypoints", "answer": ["x1", "y2"]}, "x1 only") == 0.5
    assert evidence_recall({"ability": "summarization", "evidence": [1, 2]}, "line one", {1: "line one", 2: "two"}) == 0.5


def test_eval_memory_beats_long_context_at_the_same_budget(suite, tmp_path):
    rep = evaluate_suite(suite, budget_tokens=1024, store_path=str(tmp_path / "m.sqlite"), reader=ScriptedReader())
    assert rep["budget_tokens"] == 1024 and rep["questions"] == 60 and rep["tokens"] == read_meta(suite)["tokens"]
    for key in ("memory", "long_context"):
        assert set(rep[key]) == set(ABILITIES) | {"mean"}
        assert all(0.0 <= v <= 1.0 for v in rep[key].values())
    assert rep["memory"]["mean"] >= 0.95 and rep["by_wording"]["paraphrased"]["questions"] == 0
    assert rep["long_context"]["mean"] <= 0.2
    assert rep["memory"]["abstention"] == 1.0 and rep["long_context"]["abstention"] == 0.0
    acc = rep["answer_accuracy"]
    assert acc["reader"] == "scripted" and acc["memory"]["mean"] >= 0.9 > acc["long_context"]["mean"]
    # With a budget as large as the history, the baseline sees everything.
    full = evaluate_suite(suite, budget_tokens=3 * TOKENS, store_path=str(tmp_path / "m.sqlite"))
    assert full["long_context"]["mean"] == 1.0 and "answer_accuracy" not in full
    write_report(rep, str(tmp_path / "out" / "r.json"))
    assert json.load(open(tmp_path / "out" / "r.json"))["memory"] == rep["memory"]


def test_cli_suite_and_eval(tmp_path):
    from mpa_jax.cli import main

    d, out = str(tmp_path / "cli"), str(tmp_path / "r.json")
    wd = ["--workdir", str(tmp_path / "wd")]
    assert main(["memory", "suite", "--tokens", "20000", "--out", d, *wd, "--config.memory.per_ability=2"]) == 0
    assert read_meta(d)["questions"] == 20
    assert main(["memory", "eval", "--suite", d, "--out", out, "--budget", "512", *wd]) == 0
    rep = json.load(open(out))
    assert rep["budget_tokens"] == 512 and "mean" in rep["memory"] and "mean" in rep["long_context"]
    assert main(["memory", "suite", "--tokens", "lots", "--out", d, *wd]) == 2
    assert main(["memory", "eval", "--suite", str(tmp_path / "nope"), "--out", out, *wd]) == 2
    assert main(["memory", "eval", "--suite", d, "--out", out, "--reader", "psychic", *wd]) == 2


def test_planner_backend_as_reader(suite):
    """Any harness planner backend (respond(messages, tools) -> reply with .text) reads: a scripted one here."""
    from mpa_jax.harness.memory.evaluate import PlannerReader

    class Reply:
        def __init__(self, text):
            self.text = text

    class EchoPlanner:  # answers with the memory block it was given, or "unknown" on NOTHING KNOWN
        def __init__(self):
            self.calls = []

        def respond(self, messages, tools):
            self.calls.append((messages, tools))
            memory = messages[0]["content"].split("Memory:\n", 1)[1]
            return Reply("unknown" if memory.startswith("NOTHING KNOWN") else memory)

    planner = EchoPlanner()
    rep = evaluate_suite(suite, budget_tokens=1024, reader=PlannerReader(planner))
    assert len(planner.calls) == 2 * rep["questions"] and planner.calls[0][1] is None
    acc = rep["answer_accuracy"]
    assert acc["reader"] == "planner" and acc["memory"]["information_extraction"] == 1.0
    assert acc["memory"]["abstention"] == 1.0 and acc["long_context"]["mean"] < acc["memory"]["mean"]


def test_openai_reader_over_loopback_http(tmp_path):
    """The OpenAI-compatible reader path over real loopback HTTP. No trained model is served on this machine,
    so a stand-in endpoint answers: 'unknown' when memory says NOTHING KNOWN, else it echoes the memory block."""
    import http.server
    import threading

    from mpa_jax.harness.memory.evaluate import OpenAIReader

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            memory = body["messages"][0]["content"].split("Memory:\n", 1)[1]
            text = "unknown" if memory.startswith("NOTHING KNOWN") else memory
            out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        d = str(tmp_path / "s")
        write_suite(d, 10_000, per_ability=1, paraphrase=0.0)
        reader = OpenAIReader(f"http://127.0.0.1:{srv.server_address[1]}/v1", "tiny")
        rep = evaluate_suite(d, budget_tokens=1024, reader=reader)
    finally:
        srv.shutdown()
    assert len(seen) == 2 * rep["questions"]
    assert all(p == "/v1/chat/completions" and b["model"] == "tiny" for p, b in seen)
    assert {b["messages"][1]["content"] for _, b in seen} == {q["question"] for q in read_questions(d)}
    acc = rep["answer_accuracy"]
    assert acc["reader"] == "openai"
    assert acc["memory"]["information_extraction"] == 1.0 and acc["memory"]["abstention"] == 1.0
    assert acc["long_context"]["mean"] < acc["memory"]["mean"]


def test_bench_memory_dry_run(tmp_path, capsys):
    """bench/memory.py end to end on a small suite (the 10M run lives in docs/memory.md)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "memory.py"
    spec = importlib.util.spec_from_file_location("bench_memory", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--tokens", "20000", "--dir", str(tmp_path / "b"), "--queries", "30", "--json", str(tmp_path / "b.json")])
    assert out["turns"] > 1000 and out["ingest_s"] >= 0 and out["store_mb"] > 0
    for key in ("search_questions", "search_random_turns", "context_questions"):
        assert 0 <= out[key]["p50_ms"] <= out[key]["p99_ms"] <= out[key]["max_ms"]
    assert json.load(open(tmp_path / "b.json")) == out
    assert '"ingest_s"' in capsys.readouterr().out
