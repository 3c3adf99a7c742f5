"""The harness store under failure: a process killed mid-episode (SIGKILL) loses no recorded step and
leaves a consistent store; a corrupt or locked store gives one clear error."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from mpa_jax.harness.store import HarnessStore, HarnessStoreError

CHILD = textwrap.dedent("""
    import os, signal, sys
    from mpa_jax.envs import Action, load_tasks
    from mpa_jax.harness import HarnessConfig, HarnessSession
    from mpa_jax.envs.oracle import run_oracle_episode

    store, kill_after = sys.argv[1], int(sys.argv[2])
    session = HarnessSession(HarnessConfig.defaults(enabled=True, store=store))
    real_append = session.store.append
    count = 0

    def append(*a, **k):
        global count
        seq = real_append(*a, **k)
        count += 1
        print(f"recorded {count}", flush=True)
        if count == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-episode, right after a committed step
        return seq

    session.store.append = append
    for task in load_tasks("dev")[:50]:
        run_oracle_episode(session.env_factory(), task)
    print("finished", flush=True)
""")


def test_killed_mid_episode_loses_no_recorded_step(tmp_path):
    path = str(tmp_path / "traces.sqlite")
    out = subprocess.run([sys.executable, "-c", CHILD, path, "23"], capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL, out.stderr
    lines = out.stdout.split()
    assert "finished" not in out.stdout
    recorded = int(out.stdout.strip().splitlines()[-1].split()[-1])
    assert recorded == 23 and lines
    with HarnessStore(path) as store:
        store.check()
        steps = store.steps()
        assert len(steps) == recorded
        (last,) = store.conn.execute("SELECT episode FROM traces ORDER BY id DESC LIMIT 1").fetchone()
        kinds = [s["kind"] for s in steps if s["episode"] == last]
        assert kinds[0] == "reset" and "verify" not in kinds
        # Each step is whole: its payload decodes and carries what was recorded.
        assert all(isinstance(s["payload"], dict) for s in steps)
        # The store is still writable after the crash.
        store.append("after-crash", "planner", "note", {"ok": True})
        assert store.steps("after-crash")[0]["payload"] == {"ok": True}


def test_corrupt_store_is_one_clear_error(tmp_path):
    path = tmp_path / "traces.sqlite"
    path.write_bytes(b"this is not an sqlite database at all" * 100)
    with pytest.raises(HarnessStoreError) as e:
        HarnessStore(str(path))
    msg = str(e.value)
    assert str(path) in msg and "corrupt or not a harness store" in msg and "\n" not in msg
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else/9')")
    conn.commit()
    conn.close()
    with pytest.raises(HarnessStoreError, match="format 'something-else/9'"):
        HarnessStore(str(other))


def test_locked_store_is_one_clear_error(tmp_path):
    path = str(tmp_path / "traces.sqlite")
    HarnessStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
    try:
        with pytest.raises(HarnessStoreError, match="locked by another process"):
            store = HarnessStore(path, busy_timeout_s=0.2)
            store.append("e", "planner", "x", {})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with HarnessStore(path) as store:
        store.append("e", "planner", "x", {})
        assert len(store.steps("e")) == 1
    assert os.path.exists(path + "-wal") or os.path.exists(path)
