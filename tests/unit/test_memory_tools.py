"""Memory tools for the planner (ToolSpecs + Feedback, never raising) and memory for a Memory-category Task."""
from __future__ import annotations

import json

import pytest

from mpa_jax.envs.contract import ErrorCode, Feedback, Task, ToolSpec
from mpa_jax.envs.schema import compile_schema
from mpa_jax.harness.memory import MemoryStore, MemoryTools, memory_for_task, task_now


@pytest.fixture
def tools(tmp_path):
    store = MemoryStore(str(tmp_path / "t.sqlite"))
    store.ingest_many([("s1", "2026-03-01T09:00", "user", "My coach is Dana Kim."),
                       ("s2", "2026-03-08T09:00", "user", "Quick update: my coach is now Ravi Patel, I switched from Dana Kim.")])
    yield MemoryTools(store, session="ep", clock=lambda: "2026-03-10T12:00")
    store.close()


def test_specs_are_strict_tool_specs(tools):
    specs = tools.specs()
    assert [s.name for s in specs] == ["memory_search", "memory_write"]
    for s in specs:
        assert isinstance(s, ToolSpec) and s.parameters["additionalProperties"] is False
        compile_schema(s.parameters)  # the sandbox's own validator accepts the schema
        assert ToolSpec.from_json(s.to_json()) == s
        assert s.to_openai()["function"]["name"] == s.name
    assert tools.names() == {"memory_search", "memory_write"}


def test_search_returns_current_fact_with_history_and_turns(tools):
    fb = tools.call("memory_search", {"query": "Who is my coach?"}, call_id="c1")
    assert fb.ok and fb.call_id == "c1" and fb.result["nothing_known"] is False
    fact = fb.result["facts"][0]
    assert fact["attribute"] == "coach" and fact["value"] == "Ravi Patel" and fact["earlier"] == ["Dana Kim"]
    assert fb.result["turns"][0]["date"] == "2026-03-08T09:00"
    ranged = tools.call("memory_search", {"query": "coach", "until": "2026-03-05"})
    assert [t["date"] for t in ranged.result["turns"]] == ["2026-03-01T09:00"]
    json.dumps(fb.to_dict())  # a Feedback the trajectory can store


def test_search_abstains_confidently(tools):
    fb = tools.call("memory_search", {"query": "What is the gate code at Velmora Towers?"})
    assert fb.ok and fb.result["nothing_known"] is True and "Velmora Towers" in fb.result["reason"]


def test_write_then_search(tools):
    fb = tools.call("memory_write", {"attribute": "coach", "value": "Mia Chen"})
    assert fb.ok and fb.result["fact_id"] > 0
    fb = tools.call("memory_write", {"content": "The Velmora ferry leaves from pier 4."})
    assert fb.ok and fb.result["turn_id"] > 0
    got = tools.call("memory_search", {"query": "Who is my coach?"}).result["facts"][0]
    assert got["value"] == "Mia Chen" and got["since"] == "2026-03-10T12:00" and got["earlier"] == ["Dana Kim", "Ravi Patel"]
    assert "pier 4" in tools.call("memory_search", {"query": "Velmora ferry"}).result["turns"][0]["content"]


@pytest.mark.parametrize("name,args,code,word", [
    ("memory_search", {}, ErrorCode.INVALID_ARGUMENTS, "query"),
    ("memory_search", {"query": ""}, ErrorCode.INVALID_ARGUMENTS, "query"),
    ("memory_search", {"query": "x", "limit": 0}, ErrorCode.INVALID_ARGUMENTS, "limit"),
    ("memory_search", {"query": "x", "since": "last week"}, ErrorCode.INVALID_ARGUMENTS, "since"),
    ("memory_search", {"query": "x", "since": "2026-02-31"}, ErrorCode.INVALID_ARGUMENTS, "2026-02-31"),
    ("memory_search", {"query": "x", "colour": "red"}, ErrorCode.INVALID_ARGUMENTS, "colour"),
    ("memory_search", "coach", ErrorCode.INVALID_ARGUMENTS, "object"),
    ("memory_write", {}, ErrorCode.INVALID_ARGUMENTS, "content"),
    ("memory_write", {"attribute": "coach"}, ErrorCode.INVALID_ARGUMENTS, "value"),
    ("memory_write", {"attribute": "coach", "value": "X", "kind": "rumour"}, ErrorCode.INVALID_ARGUMENTS, "kind"),
    ("memory_forget", {"query": "x"}, ErrorCode.UNKNOWN_TOOL, "memory_forget"),
])
def test_bad_calls_are_feedback_not_exceptions(tools, name, args, code, word):
    fb = tools.call(name, args, call_id="c9")
    assert isinstance(fb, Feedback) and not fb.ok and fb.error_code == code and fb.call_id == "c9"
    assert word in fb.message


def test_store_failure_is_infra(tools):
    tools.store.close()
    fb = tools.call("memory_search", {"query": "coach"})
    assert not fb.ok and fb.error_code == ErrorCode.INFRA and fb.is_infra


def _memory_task(history):
    return Task(id="mem-1", domain="health_fitness", category="memory", difficulty=2,
                instruction="Text my coach my weight in pounds.", tools=["send_sms"], verifier={}, gold=[],
                history=history, persona_seed=0)


def test_memory_for_a_benchmark_task_answers_from_history():
    """The Memory-category shape (envs.taskgen): a key turn hidden among chit-chat; the planner looks the coach up."""
    history = [{"role": "user", "content": "What's a good name for a grey cat?"},
               {"role": "assistant", "content": "Maybe Pepper, Smokey or Miso."},
               {"role": "user", "content": "I've started training with Omar Silva. They're my coach now and want weekly weigh-ins."},
               {"role": "assistant", "content": "Great, I'll remember that Omar Silva is your coach."},
               {"role": "user", "content": "Thanks for the help earlier."},
               {"role": "assistant", "content": "Anytime!"}]
    task = _memory_task(history)
    store, tools = memory_for_task(task)
    assert store.count() == 6
    now = task_now(task)
    turns = store.between("2000-01-01", now)
    assert len(turns) == 6 and turns[-1].ts < now  # history lies before the episode's clock
    fb = tools.call("memory_search", {"query": "Who is my coach?"})
    assert fb.ok and any("Omar Silva" in t["content"] for t in fb.result["turns"])
    wrote = tools.call("memory_write", {"attribute": "weight", "value": "70 kg"})
    assert wrote.ok and store.facts("weight")[0].ts == now  # writes carry the frozen episode clock
    store.close()


def test_memory_package_never_imports_jax():
    """harness never imports jax (DESIGN §2): checked in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys, mpa_jax.harness.memory, mpa_jax.harness.memory.evaluate, mpa_jax.commands.memory; "
            "print(sorted(m for m in ('jax', 'flax', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


_COACH_HISTORY = [
    {"role": "user", "content": "What's a good name for a grey cat?"},
    {"role": "assistant", "content": "Maybe Pepper, Smokey or Miso."},
    {"role": "user", "content": "I've started training with Omar Silva. They're my coach now and want weekly weigh-ins."},
    {"role": "assistant", "content": "Great, I'll remember that Omar Silva is your coach."},
]


def test_provider_context_tools_and_observe():
    """The harness provider shape: source/specs/call(name, args, call_id) + context(task, query) + observe."""
    from mpa_jax.envs.contract import Action
    from mpa_jax.harness.memory import MemoryProvider

    p = MemoryProvider(budget_tokens=200)
    task = _memory_task(_COACH_HISTORY)
    assert p.source == "memory" and [s.name for s in p.specs()] == ["memory_search", "memory_write"]
    early = p.call("memory_search", {"query": "coach"}, "c0")
    assert early.error_code == ErrorCode.PRECONDITION_FAILED  # nothing opened on this thread yet
    ctx = p.context(task, "ignored: the runtime's query")
    assert "Omar Silva" in ctx and "cat" not in ctx and len(ctx) // 4 <= 200 + 20
    fb = p.call("memory_search", {"query": "Who is my coach?"}, "c1")
    assert fb.ok and fb.call_id == "c1" and "Omar Silva" in fb.result["turns"][0]["content"]
    assert p.call("memory_search", {"query": 3}, "c2").error_code == ErrorCode.INVALID_ARGUMENTS
    p.observe(task, Action.message("I texted 154.32 lb to your coach Omar Silva."), Feedback(call_id="", status="ok"))
    p.observe(task, Action.tool_call("send_sms", {"to": "contact_1", "body": "x"}), Feedback(call_id="", status="ok"))
    turns = p.call("memory_search", {"query": "154.32 lb"}).result["turns"]
    assert [t["role"] for t in turns] == ["assistant"]
    other = _memory_task([{"role": "user", "content": "My plumber is Ana Ruiz."}])
    other.id = "mem-2"
    assert p.context(other, "") == ""  # "Text my coach ...": this history knows no coach, so no block
    assert p.call("memory_search", {"query": "coach"}).result["nothing_known"] is True  # now routed to mem-2
    p.close()


def test_provider_routes_each_thread_to_its_episode():
    import threading

    from mpa_jax.harness.memory import MemoryProvider

    p = MemoryProvider()
    a = _memory_task([{"role": "user", "content": "My coach is Dana Kim."}])
    b = _memory_task([{"role": "user", "content": "My coach is Ravi Patel."}])
    b.id = "mem-b"
    got: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def run(task, key):
        p.context(task, "")
        barrier.wait()  # both episodes open before either calls a tool
        got[key] = p.call("memory_search", {"query": "Who is my coach?"}).result["facts"][0]["value"]

    threads = [threading.Thread(target=run, args=(t, k)) for t, k in ((a, "a"), (b, "b"))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert got == {"a": "Dana Kim", "b": "Ravi Patel"}
    p.close()


def test_provider_with_a_persistent_store(tmp_path):
    from mpa_jax.harness.memory import MemoryProvider

    path = str(tmp_path / "user.sqlite")
    task = _memory_task(_COACH_HISTORY)
    p = MemoryProvider(path)
    p.context(task, "")
    assert p.call("memory_write", {"attribute": "gym", "value": "Harbor Fitness"}).ok
    p.close()
    again = MemoryProvider(path)
    again.context(task, "")  # the same task's history is not ingested twice
    store = again.open(task).store
    assert store.count() == len(_COACH_HISTORY) and store.facts("gym")[0].value == "Harbor Fitness"
    again.close()
    with pytest.raises(ValueError, match="budget_tokens"):
        MemoryProvider(budget_tokens=4)


def test_provider_from_the_tiny_config(tmp_path):
    from mpa_jax.config import load_config_file
    from mpa_jax.harness.memory import MemoryProvider

    from pathlib import Path

    from mpa_jax.harness import HarnessConfig

    cfg = load_config_file(str(Path(__file__).resolve().parents[2] / "configs" / "tiny.py"))
    p = MemoryProvider.from_config(HarnessConfig.from_config(cfg))
    assert p.path is None and p.budget_tokens == cfg.harness.memory_tokens
    cfg.harness.memory_store = str(tmp_path / "m.sqlite")
    q = MemoryProvider.from_config(HarnessConfig.from_config(cfg))
    assert q.path == cfg.harness.memory_store
    q.close()


def test_provider_on_the_benchmark_memory_tasks():
    """Every dev-split Memory task through the provider: the memory block holds the history's informative user
    turns (taskgen's key turns, not its chit-chat) for at least 90% of them (measured: 132 of 136)."""
    from mpa_jax.envs import load_tasks
    from mpa_jax.envs.taskgen import CHITCHAT
    from mpa_jax.harness.memory import MemoryProvider

    chit = {c for pair in CHITCHAT for c in pair}
    tasks = [t for t in load_tasks("dev") if t.category == "memory"]
    assert len(tasks) > 50
    p = MemoryProvider(budget_tokens=512)
    got = total = 0
    for t in tasks:
        ctx = p.context(t, "")
        key = [h["content"] for h in t.history if h["role"] == "user" and h["content"] not in chit]
        got += sum(1 for k in key if k in ctx)
        total += len(key)
    p.close()
    assert got / total >= 0.9
