"""The simulated apps' state store: one SQLite table per entity, typed deltas checked then applied in one
transaction, and the reply cache keyed by the state's hash."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any, Iterable

from mpa_jax.envs.contract import canonical_json
from mpa_jax.envs.simulated.catalog import SIM_BY_TABLE, SIM_ENTITIES


class InvalidReply(ValueError):
    """The simulator's reply broke the schema or disagreed with the state store; the message says how.
    Defined here, below `protocol`, so that the protocol imports the store and never the reverse."""


class SimState:
    """The simulated apps' state: one SQLite table per entity (id, row JSON), transactional deltas."""

    def __init__(self) -> None:
        # autocommit (isolation_level=None) so that BEGIN/COMMIT are explicit; any thread: EnvPool steps an env
        # from its workers, one call at a time
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        for e in SIM_ENTITIES:
            self.conn.execute(f"CREATE TABLE {e.table} (id TEXT PRIMARY KEY, row TEXT NOT NULL)")

    def load(self, rows: dict[str, dict[str, dict[str, Any]]]) -> None:
        """Replace the whole state with `rows` ({table: {id: row}})."""
        self.conn.execute("BEGIN")
        for e in SIM_ENTITIES:
            self.conn.execute(f"DELETE FROM {e.table}")
            for rid, row in rows.get(e.table, {}).items():
                self.conn.execute(f"INSERT INTO {e.table} VALUES (?, ?)", (rid, canonical_json({**row, "id": rid})))
        self.conn.execute("COMMIT")

    def rows(self, table: str) -> dict[str, dict[str, Any]]:
        return {rid: json.loads(r) for rid, r in self.conn.execute(f"SELECT id, row FROM {table} ORDER BY id")}

    def dump(self, tables: Iterable[str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return {t: self.rows(t) for t in (tables if tables is not None else SIM_BY_TABLE)}

    def state_hash(self) -> str:
        return hashlib.blake2b(canonical_json(self.dump()).encode(), digest_size=8).hexdigest()

    def check_delta(self, delta: list[dict[str, Any]]) -> None:
        """Raise InvalidReply unless every op fits the store (tables, ids, fields and their types)."""
        seen: dict[tuple[str, str], bool] = {}
        for i, d in enumerate(delta):
            e = SIM_BY_TABLE.get(d["table"])
            if e is None:
                raise InvalidReply(f"delta[{i}]: unknown table {d['table']!r}")
            key = (d["table"], d["id"])
            exists = seen.get(key)
            if exists is None:
                exists = self.conn.execute(f"SELECT 1 FROM {e.table} WHERE id = ?", (d["id"],)).fetchone() is not None
            op = d["op"]
            body = d.get("row") if op == "insert" else d.get("changes") if op == "update" else None
            if op == "insert":
                if exists:
                    raise InvalidReply(f"delta[{i}]: insert of existing id {d['id']!r}")
                if not isinstance(body, dict) or set(body) - {"id"} != {f.name for f in e.fields}:
                    raise InvalidReply(f"delta[{i}]: insert needs exactly the fields {[f.name for f in e.fields]}")
            elif not exists:
                raise InvalidReply(f"delta[{i}]: {op} of missing id {d['id']!r} in {e.table}")
            if op == "update" and (not isinstance(body, dict) or not body):
                raise InvalidReply(f"delta[{i}]: update needs non-empty changes")
            if op == "delete" and ("row" in d or "changes" in d):
                raise InvalidReply(f"delta[{i}]: delete takes no row or changes")
            for k, v in (body or {}).items():
                if k == "id":
                    if v != d["id"]:
                        raise InvalidReply(f"delta[{i}]: row id {v!r} differs from {d['id']!r}")
                    continue
                f = e.field(k)
                if f is None:
                    raise InvalidReply(f"delta[{i}]: {e.table} has no field {k!r}")
                if not f.check(v):
                    raise InvalidReply(f"delta[{i}]: bad value for {e.table}.{k}: {v!r}")
            seen[key] = op != "delete"

    def apply(self, delta: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply a checked delta in one transaction; returns row-level diffs (before/after)."""
        diffs = []
        self.conn.execute("BEGIN")
        try:
            for d in delta:
                t, rid = d["table"], d["id"]
                got = self.conn.execute(f"SELECT row FROM {t} WHERE id = ?", (rid,)).fetchone()
                before = json.loads(got[0]) if got else None
                if d["op"] == "insert":
                    after = {**d["row"], "id": rid}
                    self.conn.execute(f"INSERT INTO {t} VALUES (?, ?)", (rid, canonical_json(after)))
                elif d["op"] == "update":
                    after = {**before, **d["changes"], "id": rid}
                    self.conn.execute(f"UPDATE {t} SET row = ? WHERE id = ?", (canonical_json(after), rid))
                else:
                    after = None
                    self.conn.execute(f"DELETE FROM {t} WHERE id = ?", (rid,))
                diffs.append({"table": t, "id": rid, "before": before, "after": after})
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        return diffs

    def close(self) -> None:
        self.conn.close()


class SimCache:
    """Replies cached by (tool, canonical arguments, state hash); shareable between envs.

    The state hash is in the key because a reply is only right for the rows it was given: the same call after
    a write must reach the simulator again.
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.hits = self.misses = 0

    def get(self, key: tuple[str, str, str]) -> dict[str, Any] | None:
        got = self.entries.get(key)
        self.hits += got is not None
        self.misses += got is None
        return got

    def put(self, key: tuple[str, str, str], reply: dict[str, Any]) -> None:
        self.entries[key] = reply
