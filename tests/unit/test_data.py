"""AI for Data (mpa_jax.data): gated construction by cell, oracle and teacher collection (real loopback HTTP),
curation (dedup, length cap, balance, recovery traces, datasheet) and competence feedback."""
import http.server
import json
import os
import threading

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.data import (Collector, CurationConfig, all_keys, competence_from_trajectories, construct_tasks, curate,
                          failure_clusters, generation_weights, is_recovery, key_of_task)
from mpa_jax.envs.episode import run_chat_episode
from mpa_jax.harness.planners import OpenAIChatPlanner
from mpa_jax.envs import Action, ErrorCode, Feedback, Step, Trajectory, Verification, load_tasks, make_env
from mpa_jax.envs.gate import check_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from mpa_jax.tokenizer import tokenizer_for_config

    cfg = load_config_file(os.path.join(ROOT, "configs", "micro.py"))
    return tokenizer_for_config(cfg, str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def collector(tok):
    return Collector(load_config_file(os.path.join(ROOT, "configs", "micro.py")), tok)


def test_construct_follows_weights_passes_the_gate_and_never_reuses_benchmark_tasks():
    keys = all_keys("train")
    target = [k for k in keys if k.endswith("/memory/2")][:2]
    tasks, stats = construct_tasks(6, {k: 1.0 for k in target}, round_index=3)
    assert len(tasks) == 6 and stats.kept == 6
    assert {key_of_task(t) for t in tasks} <= set(target)
    assert all(check_task(t) is None for t in tasks[:2])  # kept tasks pass the gate as they are
    assert all(t.split == "train" and t.metadata["round"] == 3 for t in tasks)
    bench = {(t.template, t.seed) for s in ("train", "dev", "test") for t in load_tasks(s)}
    assert not any((t.template, t.seed) for t in tasks if (t.template, t.seed) in bench)
    again, _ = construct_tasks(6, {k: 1.0 for k in target}, round_index=3)
    assert [t.id for t in again] == [t.id for t in tasks]  # deterministic
    other, _ = construct_tasks(6, {k: 1.0 for k in target}, round_index=4)
    assert not {t.id for t in other} & {t.id for t in tasks}
    with pytest.raises(ValueError, match="none of the weighted cells"):
        construct_tasks(2, {"nowhere/memory/9": 1.0})


def test_feedback_weights_favour_cells_of_middling_competence():
    ok = Verification(success=True, score=1.0)
    bad = Verification(success=False, score=0.0)

    def t(key_domain, v):
        return Trajectory(task_id="x", tokens=[], loss_mask=[], logprobs=[], steps=[], verification=v,
                          provenance={"domain": key_domain, "category": "tool_use", "difficulty": 1})

    trajs = [t("media", ok)] * 10 + [t("travel", bad)] * 10 + [t("utilities", ok), t("utilities", bad)] * 5
    comp = competence_from_trajectories(trajs)
    assert comp["media/tool_use/1"]["competence"] > 0.9 and comp["travel/tool_use/1"]["competence"] < 0.1
    keys = ["media/tool_use/1", "travel/tool_use/1", "utilities/tool_use/1", "notes_files/tool_use/1"]
    w = generation_weights(comp, keys)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["utilities/tool_use/1"] > w["media/tool_use/1"] and w["utilities/tool_use/1"] > w["travel/tool_use/1"]
    assert w["notes_files/tool_use/1"] == pytest.approx(w["utilities/tool_use/1"])  # unmeasured: the 0.5 prior


def _fake(task_id, domain, ok=True, n_tokens=10, error=False, text="hi"):
    steps = []
    if error:
        steps.append(Step(Action.tool_call("t", {}), Feedback.error(ErrorCode.TRANSIENT, "try again")))
    steps.append(Step(Action.message(text), None))
    return Trajectory(task_id=task_id, tokens=[1] * n_tokens, loss_mask=[1] * n_tokens, logprobs=[0.0] * n_tokens, steps=steps,
                      verification=Verification(success=ok, score=float(ok)),
                      provenance={"domain": domain, "category": "tool_use", "difficulty": 1, "planner": "oracle"},
                      messages=[{"role": "user", "content": task_id}, {"role": "assistant", "content": text}])


def test_curation_dedups_caps_balances_and_mixes_recoveries(tmp_path):
    media = [_fake(f"m{i}", "media") for i in range(8)]
    trajs = media + [media[0]]  # an exact duplicate
    trajs += [_fake("long", "media", n_tokens=500)]
    trajs += [_fake(f"r{i}", "media", error=True) for i in range(3)]  # recoveries
    trajs += [_fake(f"t{i}", "travel") for i in range(2)]
    trajs += [_fake("f1", "travel", ok=False), _fake("f2", "travel", ok=False, error=True)]
    infra = _fake("inf", "travel")
    infra.infra_failure = True
    trajs.append(infra)
    res = curate(trajs, CurationConfig(max_tokens=100, max_examples=6, recovery_fraction=0.5))
    d = res.datasheet
    assert d["drops"]["duplicate"] == 1 and d["drops"]["too_long"] == 1 and d["drops"]["infra"] == 1
    assert [t.task_id for t in res.failures] == ["f1", "f2"]
    assert all(t.verification.success for t in res.examples)
    # budget 6 split evenly: travel has only 2, so media gets 4; recoveries fill up to half the budget
    assert d["by_key"]["travel/tool_use/1"] == 2
    assert d["recovery_traces"] == 3 == sum(is_recovery(t) for t in res.examples)
    assert len(res.examples) == d["examples"] == 6
    sheet = res.write(str(tmp_path / "sft.jsonl"), name="unit")
    on_disk = json.load(open(sheet))
    assert on_disk["examples"] == 6 and on_disk["name"] == "unit" and on_disk["lengths"]["max"] == 10
    assert set(on_disk["balance"]) == {"media/tool_use/1", "travel/tool_use/1"}
    assert len(open(tmp_path / "sft.jsonl").readlines()) == 6
    assert len(open(tmp_path / "sft.failures.jsonl").readlines()) == 2
    clusters = failure_clusters(res.failures)
    assert {(c["tool"], c["error"]) for c in clusters} == {("t", "TRANSIENT"), ("-", "finish:unknown")}


def test_oracle_collection_is_verified_and_curated(collector):
    tasks, _ = construct_tasks(4, None, round_index=1)
    trajs = collector.oracle(tasks, seed=1)
    assert len(trajs) == 4 and all(t.verification.success for t in trajs)
    assert all(t.provenance["planner"] == "oracle" and sum(t.loss_mask) > 0 for t in trajs)
    res = curate(trajs, CurationConfig(max_tokens=100_000))
    assert res.datasheet["examples"] == 4 and res.datasheet["sources"] == {"oracle": 4}


def test_oracle_demonstrates_arguments_in_schema_order_whatever_the_task_file_order(collector, tmp_path):
    """Tasks read back from JSONL (the split cache, a task file) keep their gold arguments in schema order
    (Task.to_json), so demonstrations of a fresh task and of its re-read copy are the same tokens."""
    from mpa_jax.envs import read_jsonl, write_jsonl
    from mpa_jax.envs.contract import Task
    from mpa_jax.envs.tools import TOOLS

    tasks, _ = construct_tasks(8, None, round_index=1)
    multi = [t for t in tasks if any(len(g.get("arguments", {})) > 1 and list(g["arguments"]) != sorted(g["arguments"])
                                     for g in t.gold)]
    assert multi, "no gold call whose schema order differs from sorted order among the constructed tasks"
    path = tmp_path / "tasks.jsonl"
    write_jsonl(str(path), multi)
    reread = read_jsonl(str(path), Task)
    for g in (g for t in reread for g in t.gold if g.get("kind") == "tool_call"):
        order = list(TOOLS[g["name"]].spec.parameters["properties"])
        assert list(g["arguments"]) == [k for k in order if k in g["arguments"]]
    fresh = collector.oracle(multi, seed=3)
    from_file = collector.oracle(reread, seed=3)
    assert [t.tokens for t in fresh] == [t.tokens for t in from_file]


class _GoldTeacher(http.server.BaseHTTPRequestHandler):
    """A chat-completions endpoint on 127.0.0.1 that plays the task's gold plan (stands in for a teacher model)."""

    plans: dict = {}

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        assert body["tools"] and all(isinstance(c["function"]["arguments"], str)
                                     for m in msgs for c in m.get("tool_calls", []))  # OpenAI wire form
        user = next(m["content"] for m in msgs if m["role"] == "user" and m["content"] in self.plans)
        step = self.plans[user][sum(1 for m in msgs if m["role"] == "assistant")]
        if step["kind"] == "message":
            msg = {"role": "assistant", "content": step["text"]}
        else:
            msg = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": step["name"], "arguments": json.dumps(step["arguments"])}}]}
        out = json.dumps({"choices": [{"message": msg}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_teacher_collection_over_loopback_http(collector):
    simple = [t for t in load_tasks("train") if not t.faults and not t.history and not t.roles
              and all(s["kind"] in ("tool_call", "message") and "group" not in s and not s.get("fallbacks") for s in t.gold)][:2]
    assert simple
    _GoldTeacher.plans = {t.instruction: t.gold for t in simple}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GoldTeacher)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        client = OpenAIChatPlanner(f"http://127.0.0.1:{srv.server_address[1]}", model="gold")
        trajs = collector.teacher(simple, client, max_turns=8)
        # the teacher path is the OpenAI path: one client, one driver, the same episode rules
        env = collector.envs("sandbox")  # the env the collector uses (guarded by the default injection defense)
        direct = [run_chat_episode(client, env, t, max_turns=8) for t in simple]
    finally:
        srv.shutdown()
    assert [t.verification.success for t in trajs] == [True] * len(simple)
    assert all(t.provenance["planner"] == "teacher:gold" and sum(t.loss_mask) > 0 for t in trajs)
    for traj, ep in zip(trajs, direct):
        assert traj.messages == ep.messages and [s.to_dict() for s in traj.steps] == [s.to_dict() for s in ep.steps]
        assert traj.verification == ep.verification and ep.finish_reason == "answer"
    # a call named by the endpoint keeps its id (the teacher's own loop named them call_{n})
    assert [s.action.call_id for s in trajs[0].steps if s.action.kind == "tool_call"][0] == "c1"
    # an unreachable endpoint is an infra failure per episode, reported, never a crash or an example
    errors = []
    dead = collector.teacher(simple[:1], OpenAIChatPlanner(f"http://127.0.0.1:{srv.server_address[1]}", timeout_s=2),
                             max_turns=8, on_error=lambda t, e: errors.append(e))
    assert dead[0].infra_failure and dead[0].finish_reason == "infra" and "planner endpoint" in str(errors[0])
    assert curate(dead).datasheet["drops"] == {"infra": 1}


class _Rewriter(http.server.BaseHTTPRequestHandler):
    """Rewords by prefixing; drops the digits of requests that mention 'drop' (a bad rewording)."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        out = "Could you please do this: " + text[0].lower() + text[1:]
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": out}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_paraphrased_construction_is_gated():
    from mpa_jax.data import paraphraser

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rewriter)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        para = paraphraser(OpenAIChatPlanner(f"http://127.0.0.1:{srv.server_address[1]}"))
        tasks, stats = construct_tasks(3, None, round_index=5, paraphrase=para)
    finally:
        srv.shutdown()
    assert stats.paraphrased >= 1 and len(tasks) == 3
    for t in tasks:
        if t.metadata.get("paraphrased"):
            assert t.instruction.startswith("Could you please do this:") and check_task(t) is None
