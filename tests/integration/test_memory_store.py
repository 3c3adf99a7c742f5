"""The memory store on real SQLite files: knowledge updates, time ranges, abstention, WAL crash safety."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mpa_jax.harness.memory import NOTHING_KNOWN, MemoryContext, MemoryStore, estimate_tokens, extract_facts, long_context


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(str(tmp_path / "mem.sqlite"))
    s.ingest_many([
        ("1", "2026-03-01T09:00", "user", "My dentist is Dana Kim."),
        ("1", "2026-03-01T09:01", "assistant", "Got it."),
        ("2", "2026-03-04T10:00", "user", "I booked the Velmora ferry for Saturday."),
        ("3", "2026-03-09T18:00", "user", "Quick update: my dentist is now Ravi Patel, I switched from Dana Kim."),
        ("3", "2026-03-09T18:01", "user", "From now on, whenever I ask about flights, give prices in euros."),
        ("4", "2026-03-12T08:00", "user", "When it comes to dinner out, I prefer vegetarian places."),
    ])
    yield s
    s.close()


def test_wal_mode_and_persistence(tmp_path, store):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    again = MemoryStore(store.path)
    assert again.count() == 6
    assert again.facts("dentist")[0].value == "Ravi Patel"
    again.close()


def test_knowledge_update_newer_wins_and_history_kept(store):
    (f,) = store.facts("dentist")
    assert f.value == "Ravi Patel" and f.ts == "2026-03-09T18:00"
    assert [h["value"] for h in f.history] == ["Dana Kim"]
    # An explicit write of an older value (out of order) goes to history, not to the front.
    store.write_fact("dentist", "Old Doc", ts="2026-02-01T00:00")
    (f,) = store.facts("dentist")
    assert f.value == "Ravi Patel" and [h["value"] for h in f.history] == ["Old Doc", "Dana Kim"]
    store.write_fact("dentist", "Mia Chen", ts="2026-03-20T00:00", kind="fact")
    (f,) = store.facts("dentist")
    assert f.value == "Mia Chen" and len(f.history) == 3
    with pytest.raises(ValueError, match="kind"):
        store.write_fact("x", "y", kind="rumour", ts="2026-03-20T00:00")


def test_extract_facts_kinds():
    got = extract_facts("Quick update: my coach is now Ana Ruiz, I switched. I prefer aisle seats. "
                        "From now on, whenever I ask about hotels, mention the source.")
    assert ("coach", "Ana Ruiz", "fact") in got
    kinds = {k for _, _, k in got}
    assert kinds == {"fact", "preference", "instruction"}


def test_search_ranks_the_update_and_returns_the_current_fact(store):
    res = store.search("Who is my dentist now?")
    assert not res.abstain
    assert res.facts[0].value == "Ravi Patel"
    assert "Ravi Patel" in res.hits[0].content  # newer of two equal matches wins on recency


def test_time_range_queries(store):
    inside = store.between("2026-03-02", "2026-03-10")
    assert [h.session for h in inside] == ["2", "3", "3"]
    assert [h.ts for h in inside] == sorted(h.ts for h in inside)
    only = store.between("2026-03-02", "2026-03-10", query="dentist")
    assert [h.content for h in only] == ["Quick update: my dentist is now Ravi Patel, I switched from Dana Kim."]
    assert store.search("dentist", until="2026-03-02").hits[0].ts == "2026-03-01T09:00"
    with pytest.raises(ValueError, match="not an ISO date"):
        store.between("March", "2026-03-10")


def test_abstention_is_a_confident_nothing_known(store):
    unknown = store.search("What is the locker code at Harbor Gym?")
    assert unknown.abstain and "Harbor Gym" in unknown.reason and not unknown.hits
    assert store.search("???").abstain  # no content words
    assert store.search("what about quantum chromodynamics").abstain  # no stored word
    ctx = MemoryContext(store).context("What is the locker code at Harbor Gym?", 200)
    assert ctx.startswith(NOTHING_KNOWN)
    assert not store.search("Tell me about the Velmora ferry").abstain


def test_context_respects_the_budget_and_carries_standing_instructions(store):
    mc = MemoryContext(store)
    ctx = mc.context("Can you give me an update on flights?", 400)
    assert "give prices in euros" in ctx and estimate_tokens(ctx) <= 400
    small = mc.context("Any suggestions for dinner out this weekend?", 60)
    assert estimate_tokens(small) <= 60
    lc = long_context(store, 40)
    assert "vegetarian" in lc and "Dana Kim." not in lc and estimate_tokens(lc) <= 40


_WRITER = r"""
import sys
from mpa_jax.harness.memory import MemoryStore, store as store_module
s = MemoryStore(sys.argv[1])
extract, seen = store_module.extract_facts, [0]
def extract_then_stop(content):
    # runs inside ingest_many's transaction, once per user turn: in batch 6, turn 250 says so and blocks,
    # so the parent's SIGKILL lands mid-transaction by construction (no timing)
    seen[0] += 1
    if seen[0] == 5 * 500 + 250:
        print("mid", flush=True)
        sys.stdin.read()
    return extract(content)
store_module.extract_facts = extract_then_stop
for b in range(6):
    s.ingest_many([(str(b), "2026-03-01T09:00", "user", f"batch {b} turn {i} about the ferry") for i in range(500)])
    print(b + 1, flush=True)
"""


def test_wal_crash_safety_kill_writer_mid_way(tmp_path):
    """A writer killed with SIGKILL mid-transaction leaves the store at its last committed batch."""
    path = str(tmp_path / "crash.sqlite")
    p = subprocess.Popen([sys.executable, "-c", _WRITER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline().strip() for _ in range(6)]
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert lines == ["1", "2", "3", "4", "5", "mid"], lines
    s = MemoryStore(path)
    n = s.count()
    assert n == 5 * 500  # the five committed batches, none of the sixth's 250 inserted rows
    assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    s.conn.execute("INSERT INTO turns_fts(turns_fts) VALUES ('integrity-check')")  # FTS index matches the rows
    fts = s.conn.execute("SELECT count(*) FROM turns_fts WHERE turns_fts MATCH 'ferry'").fetchone()[0]
    assert fts == n
    s.ingest_turn("after", "2026-03-02T09:00", "user", "still writable")
    assert s.count() == n + 1
    s.close()


def test_one_store_shared_by_threads(tmp_path):
    """Harness episodes on threads may share one persistent store: writes and searches interleave safely."""
    import threading

    s = MemoryStore(str(tmp_path / "shared.sqlite"))
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(40):
                s.ingest_turn(f"t{k}", f"2026-03-{1 + i % 28:02d}T09:00", "user", f"thread {k} note {i} about the Velmora ferry")
                assert not s.search("Velmora ferry").abstain
                s.write_fact(f"counter {k}", str(i), ts=f"2026-03-{1 + i // 2:02d}T09:{i:02d}")  # newer each time
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors[0]
    assert s.count() == 160
    assert all(s.facts(f"counter {k}")[0].value == "39" for k in range(4))
    s.close()
