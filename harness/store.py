"""The harness store: one SQLite file (WAL journal) holding every recorded trace step and the evolution
proposals with their review decisions.

Why SQLite WAL: each step is its own committed transaction, so a process killed mid-episode loses
nothing it recorded and never leaves a half-written row; readers never block the writer. A file that
is not a harness store (corrupt, truncated, another format) or that stays locked by another process
gives one `HarnessStoreError` naming the file and what is wrong.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from typing import Any, Iterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS traces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    episode TEXT NOT NULL,
    seq INTEGER NOT NULL,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    t REAL NOT NULL,
    UNIQUE (episode, seq)
);
CREATE TABLE IF NOT EXISTS proposals (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    cluster TEXT NOT NULL,
    payload TEXT NOT NULL,
    evidence TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    decided_by TEXT NOT NULL DEFAULT '',
    decided_at REAL NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT '',
    version TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL
);
"""
STORE_FORMAT = "mpa-harness-store/1"


class HarnessStoreError(RuntimeError):
    """The harness store cannot be used; the message names the file and the reason."""


class HarnessStore:
    """Trace steps and proposals in one SQLite file. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str, busy_timeout_s: float = 5.0) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._lock = threading.Lock()
        try:
            self.conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise HarnessStoreError(f"harness store {self.path}: cannot switch to WAL journal (got {mode})")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.executescript(SCHEMA)
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
            if row is None:
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (STORE_FORMAT,))
            elif row[0] != STORE_FORMAT:
                raise HarnessStoreError(f"harness store {self.path}: format {row[0]!r}, expected {STORE_FORMAT!r}")
        except sqlite3.DatabaseError as e:
            raise _store_error(self.path, e) from None

    # ---------------------------------------------------------------- traces
    def append(self, episode: str, agent: str, kind: str, payload: dict[str, Any]) -> int:
        """Record one step (committed before returning); returns its sequence number in the episode."""
        body = json.dumps(payload, sort_keys=True, default=repr)
        with self._lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    row = self.conn.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM traces WHERE episode = ?", (episode,)).fetchone()
                    seq = int(row[0])
                    self.conn.execute("INSERT INTO traces (episode, seq, agent, kind, payload, t) VALUES (?, ?, ?, ?, ?, ?)",
                                      (episode, seq, agent, kind, body, time.time()))
                    self.conn.execute("COMMIT")
                except BaseException:
                    self.conn.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None
        return seq

    def steps(self, episode: str | None = None) -> list[dict[str, Any]]:
        """Recorded steps (of one episode, or all) in order."""
        q = "SELECT episode, seq, agent, kind, payload FROM traces"
        args: tuple[Any, ...] = ()
        if episode is not None:
            q += " WHERE episode = ?"
            args = (episode,)
        q += " ORDER BY episode, seq"
        with self._lock:
            try:
                rows = self.conn.execute(q, args).fetchall()
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None
        return [{"episode": e, "seq": s, "agent": a, "kind": k, "payload": json.loads(p)} for e, s, a, k, p in rows]

    def check(self) -> None:
        """Raise HarnessStoreError unless SQLite's integrity check passes."""
        with self._lock:
            try:
                res = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None
        if res != "ok":
            raise HarnessStoreError(f"harness store {self.path} is corrupt: {res}")

    # ---------------------------------------------------------------- proposals
    def add_proposal(self, pid: str, kind: str, cluster: str, payload: dict[str, Any], evidence: list[dict[str, Any]]) -> bool:
        """Insert a pending proposal; False when one with this id exists (mining twice adds nothing)."""
        with self._lock:
            try:
                cur = self.conn.execute(
                    "INSERT OR IGNORE INTO proposals (id, kind, cluster, payload, evidence, created) VALUES (?, ?, ?, ?, ?, ?)",
                    (pid, kind, cluster, json.dumps(payload, sort_keys=True), json.dumps(evidence, sort_keys=True), time.time()))
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None
        return cur.rowcount == 1

    def proposals(self, status: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT id, kind, cluster, payload, evidence, status, decided_by, decided_at, note, version, created FROM proposals"
        args: tuple[Any, ...] = ()
        if status is not None:
            q += " WHERE status = ?"
            args = (status,)
        q += " ORDER BY created, id"
        with self._lock:
            try:
                rows = self.conn.execute(q, args).fetchall()
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None
        keys = ("id", "kind", "cluster", "payload", "evidence", "status", "decided_by", "decided_at", "note", "version", "created")
        out = []
        for r in rows:
            d = dict(zip(keys, r))
            d["payload"] = json.loads(d["payload"])
            d["evidence"] = json.loads(d["evidence"])
            out.append(d)
        return out

    def decide(self, pid: str, status: str, by: str, note: str = "") -> None:
        """Record a review decision (approved/rejected) on a pending proposal."""
        if status not in ("approved", "rejected"):
            raise ValueError(f"decision must be approved or rejected, got {status!r}")
        with self._lock:
            try:
                row = self.conn.execute("SELECT status FROM proposals WHERE id = ?", (pid,)).fetchone()
                if row is None:
                    raise HarnessStoreError(f"no proposal with id {pid!r} in {self.path}")
                if row[0] != "pending":
                    raise HarnessStoreError(f"proposal {pid} is already {row[0]}")
                self.conn.execute("UPDATE proposals SET status = ?, decided_by = ?, decided_at = ?, note = ? WHERE id = ?",
                                  (status, by, time.time(), note, pid))
            except sqlite3.DatabaseError as e:
                raise _store_error(self.path, e) from None

    def mark_released(self, pids: list[str], version: str) -> None:
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            for pid in pids:
                self.conn.execute("UPDATE proposals SET version = ? WHERE id = ?", (version, pid))
            self.conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def __enter__(self) -> "HarnessStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.steps())


def _store_error(path: str, e: sqlite3.DatabaseError) -> HarnessStoreError:
    msg = str(e)
    if "locked" in msg or "busy" in msg:
        return HarnessStoreError(f"harness store {path} is locked by another process (gave up waiting): {msg}")
    if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
        return HarnessStoreError(f"harness store {path} is corrupt or not a harness store: {msg}")
    return HarnessStoreError(f"harness store {path}: {msg}")
