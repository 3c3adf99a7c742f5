"""World state of the sandbox: one in-memory SQLite database per episode.

A persona world is generated from a seed once per process and kept as a prebuilt database; an episode
starts from a `sqlite3` backup of it (sub-millisecond) plus the task's patch. Every write goes through
`World.insert/update/delete/set_device`, which record a row-level diff: the ledger stores these diffs and
`apply_diff` replays them, so the ledger alone reproduces the end state.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import sqlite3
import zlib
from typing import Any, Iterable

from mpa_jax.envs.catalog import CITIES, ENTITIES, ENTITY_BY_NAME, FIRST, LAST, POOLS, Entity, Field

DEVICE_DEFAULTS: dict[str, Any] = {
    "airplane_mode": False,
    "wifi": True,
    "cellular": True,
    "bluetooth": False,
    "location_services": True,
    "do_not_disturb": False,
    "low_power_mode": False,
    "dark_mode": False,
    "battery": 80,
    "brightness": 60,
    "ringer_volume": 70,
    "media_volume": 50,
    "now_playing": "",
    "playing": False,
    "flashlight": False,
}
ROLES: tuple[str, ...] = ("coach", "dentist", "landlord", "babysitter", "manager", "sister", "plumber", "tutor")

_SQL_TYPES = {"int": "INTEGER", "num": "REAL", "bool": "INTEGER"}


def stable_hash(*parts: Any) -> int:
    """A process-independent hash (Python's hash() is salted per process)."""
    return zlib.crc32("\x1f".join(map(str, parts)).encode())


@dataclasses.dataclass(frozen=True)
class Persona:
    """Facts about the user a generator may use; `roles` maps a role (coach, ...) to a contact id."""

    seed: int
    user_name: str
    home_city: str
    now: str  # frozen clock, ISO "YYYY-MM-DDTHH:MM"
    roles: dict[str, str]
    twins: tuple[str, str]  # two contact ids that share a first name (ambiguity tasks)


def _date(base: dt.date, rng: random.Random, lo: int = -20, hi: int = 40) -> str:
    return (base + dt.timedelta(days=rng.randint(lo, hi))).isoformat()


def sample_value(f: Field, rng: random.Random, today: dt.date) -> Any:
    """A plausible value for field `f` (pools declared in the catalog plus a few computed kinds)."""
    p = f.pool
    if f.type == "bool":
        return rng.random() < 0.5
    if f.type == "enum":
        return rng.choice(f.enum)
    if p in POOLS:
        return rng.choice(POOLS[p])
    if p == "person":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    if p == "phone":
        return f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if p in ("email", "to", "sender", "recipient"):
        return f"{rng.choice(FIRST).lower()}.{rng.choice(LAST).lower()}@example.com"
    if p == "birthday":
        return dt.date(rng.randint(1960, 2005), rng.randint(1, 12), rng.randint(1, 28)).isoformat()
    if f.type == "date" or p == "date":
        return _date(today, rng)
    if f.type == "time" or p == "time":
        return f"{rng.randint(6, 21):02d}:{rng.choice((0, 15, 30, 45)):02d}"
    if p == "datetime":
        return f"{_date(today, rng, -20, 0)}T{rng.randint(7, 22):02d}:{rng.choice((5, 20, 35, 50)):02d}"
    ranges = {
        "minutes": (5, 120, 5), "duration_s": (30, 1800, 1), "size_kb": (10, 5000, 1), "qty": (1, 6, 1),
        "party": (2, 8, 1), "calories": (100, 800, 10), "nights": (1, 7, 1), "per_day": (1, 3, 1),
        "water": (250, 2000, 250), "song_len": (150, 320, 1),
    }
    if p in ranges:
        lo, hi, step = ranges[p]
        return rng.randrange(lo, hi + 1, step)
    money = {"price": (1, 60), "fare": (20, 300), "fare_big": (80, 900), "balance": (300, 8000),
             "pay_amount": (20, 900), "txn_amount": (5, 250)}
    if p in money:
        lo, hi = money[p]
        v = round(rng.uniform(lo, hi), 2)
        return -v if p == "txn_amount" else v
    if p == "rating":
        return round(rng.uniform(3.0, 5.0), 1)
    if p == "weight":
        return round(rng.uniform(55, 95), 1)
    if p == "sleep_hours":
        return rng.choice((5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5))
    if p == "iban":
        return "DE" + "".join(str(rng.randint(0, 9)) for _ in range(20))
    if p == "last4":
        return f"{rng.randint(0, 9999):04d}"
    if p == "flight_no":
        return f"{rng.choice(('SW', 'AA', 'NJ', 'PW', 'SL'))}{rng.randint(100, 999)}"
    if p == "url":
        return f"https://www.{rng.choice(('news', 'shop', 'learn', 'trails', 'weather', 'events'))}{rng.randint(1, 99)}.example.com"
    raise KeyError(f"no value pool {p!r} for field {f.name!r}")


# ------------------------------------------------------------------------------------------- schema


def create_schema(conn: sqlite3.Connection) -> None:
    """Create one table per entity (namespaced by app) plus the device table."""
    stmts = ["CREATE TABLE device (key TEXT PRIMARY KEY, value TEXT NOT NULL)"]
    for e in ENTITIES:
        cols = ", ".join(f"{f.name} {_SQL_TYPES.get(f.type, 'TEXT')}" for f in e.fields)
        stmts.append(f"CREATE TABLE {e.table} (n INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
    conn.executescript(";\n".join(stmts))


def to_sql(f: Field, v: Any) -> Any:
    if f.type == "bool" and v is not None:
        return 1 if v else 0
    return v


def row_converter(e: Entity):
    """Return fn(tuple from `SELECT n, fields...`) -> output dict with string id and typed values."""
    names = [f.name for f in e.fields]
    bools = [i for i, f in enumerate(e.fields) if f.type == "bool"]
    prefix = e.name + "_"

    def convert(row: tuple) -> dict[str, Any]:
        vals = list(row[1:])
        for i in bools:
            if vals[i] is not None:
                vals[i] = bool(vals[i])
        out = {"id": prefix + str(row[0])}
        out.update(zip(names, vals))
        return out

    return convert


CONVERTERS = {e.name: row_converter(e) for e in ENTITIES}
ENTITY_BY_TABLE = {e.table: e for e in ENTITIES}


def parse_id(e: Entity, value: str) -> int | None:
    """`contact_12` -> 12 for entity contact; None if the prefix or number is wrong."""
    prefix = e.name + "_"
    if not value.startswith(prefix):
        return None
    tail = value[len(prefix):]
    return int(tail) if tail.isdigit() else None


# ------------------------------------------------------------------------------------------- persona


def build_persona(seed: int) -> tuple[Persona, dict[str, list[dict[str, Any]]]]:
    """Generate the persona facts and the rows of every table from `seed` (deterministic)."""
    rng = random.Random(stable_hash("persona", seed))
    start = dt.date(2026, 3, 1) + dt.timedelta(days=rng.randint(0, 40))
    now = f"{start.isoformat()}T{rng.randint(8, 10):02d}:{rng.choice((0, 15, 30)):02d}"
    rows: dict[str, list[dict[str, Any]]] = {}
    for e in ENTITIES:
        used: set[Any] = set()
        lst: list[dict[str, Any]] = []
        for i in range(e.n):
            row: dict[str, Any] = {}
            for f in e.fields:
                if f.ref or f.derived:
                    continue
                for _ in range(50):
                    v = sample_value(f, rng, start)
                    if f.name != e.title or v not in used:
                        break
                row[f.name] = v
            if e.title in row:
                used.add(row[e.title])
            lst.append(row)
        rows[e.name] = lst
    # Contacts: unique full names, two sharing a first name, emails matching names.
    firsts = rng.sample(FIRST, len(rows["contact"]))
    lasts = rng.sample(LAST, len(rows["contact"]))
    twin_first = firsts[0]
    firsts[1] = twin_first
    for r, fn, ln in zip(rows["contact"], firsts, lasts):
        r["name"] = f"{fn} {ln}"
        r["email"] = f"{fn.lower()}.{ln.lower()}@example.com"
    role_idx = rng.sample(range(2, len(rows["contact"])), len(ROLES))
    roles = {role: f"contact_{i + 1}" for role, i in zip(ROLES, role_idx)}
    for i in role_idx:  # relation must not give the role away: memory tasks rely on history
        rows["contact"][i]["relation"] = rng.choice(("friend", "neighbor"))
    _fill_refs(rows, rng)
    # Flights: origin != destination, all after "now".
    for r in rows["flight"]:
        while r["destination"] == r["origin"]:
            r["destination"] = rng.choice(CITIES)
        r["date"] = _date(start, rng, 1, 40)
    for r in rows["bill"]:
        r["paid"] = False
    for r in rows["account"]:
        r["currency"] = "USD"
    persona = Persona(
        seed=seed,
        user_name=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
        home_city=rng.choice(CITIES),
        now=now,
        roles=roles,
        twins=("contact_1", "contact_2"),
    )
    return persona, rows


def _fill_refs(rows: dict[str, list[dict[str, Any]]], rng: random.Random) -> None:
    for e in ENTITIES:
        refs = [f for f in e.fields if f.ref]
        if not refs:
            continue
        for r in rows[e.name]:
            for f in refs:
                k = rng.randrange(len(rows[f.ref]))
                r[f.name] = f"{f.ref}_{k + 1}"
            for f in e.fields:
                if f.derived:
                    src, col = f.derive
                    ref_e = ENTITY_BY_NAME[e.field(src).ref]
                    k = parse_id(ref_e, r[src])
                    r[f.name] = rows[ref_e.name][k - 1][col]


_PERSONAS: dict[int, tuple[Persona, sqlite3.Connection, dict[str, list[dict[str, Any]]]]] = {}
_PERSONA_DEVICE: dict[int, dict[str, Any]] = {}


def persona_world(seed: int) -> tuple[Persona, sqlite3.Connection, dict[str, list[dict[str, Any]]]]:
    """The prebuilt persona database for `seed` (cached per process); never written to."""
    got = _PERSONAS.get(seed)
    if got is None:
        persona, rows = build_persona(seed)
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        create_schema(conn)
        conn.execute("BEGIN")
        for key, value in DEVICE_DEFAULTS.items():
            conn.execute("INSERT INTO device VALUES (?, ?)", (key, json.dumps(value)))
        conn.execute("INSERT INTO device VALUES (?, ?)", ("now", json.dumps(persona.now)))
        conn.execute("INSERT INTO device VALUES (?, ?)", ("location", json.dumps(persona.home_city)))
        for e in ENTITIES:
            names = [f.name for f in e.fields]
            sql = f"INSERT INTO {e.table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
            conn.executemany(sql, [tuple(to_sql(f, r.get(f.name)) for f in e.fields) for r in rows[e.name]])
        conn.execute("COMMIT")
        _PERSONA_DEVICE[seed] = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM device")}
        got = (persona, conn, rows)
        _PERSONAS[seed] = got
    return got


# ------------------------------------------------------------------------------------------- world


class World:
    """The live state of one episode. Writes record diffs in `self.diff` (cleared by the caller per call)."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.device: dict[str, Any] = {}
        self.diff: list[dict[str, Any]] = []
        self.persona: Persona | None = None
        self.page_cap: int | None = None  # set by the sandbox while a partial-page fault applies

    def load(self, persona_seed: int, patch: dict[str, Any]) -> None:
        """Restore the persona database by SQLite backup, then apply the task's patch (not recorded)."""
        persona, src, _ = persona_world(persona_seed)
        src.backup(self.conn)
        self.persona = persona
        self.device = dict(_PERSONA_DEVICE[persona_seed])  # the backup's device table, already decoded
        if patch:
            self.apply_patch(patch)
        self.diff = []

    def apply_patch(self, patch: dict[str, Any]) -> None:
        """Patch format: {"device": {key: value}, "rows": {entity: [row...]}, "update": {entity: {id: {f: v}}},
        "delete": {entity: [id...]}}."""
        unknown = set(patch) - {"device", "rows", "update", "delete"}
        if unknown:
            raise ValueError(f"initial_state: unknown key {sorted(unknown)[0]!r}")
        for section in ("rows", "update", "delete"):
            for name in patch.get(section, {}):
                if name not in ENTITY_BY_NAME:
                    raise ValueError(f"initial_state.{section}: unknown entity {name!r}")
        self.conn.execute("BEGIN")
        try:
            for k, v in patch.get("device", {}).items():
                self.set_device(k, v)
            for name, rows in patch.get("rows", {}).items():
                for row in rows:
                    self.insert(ENTITY_BY_NAME[name], row)
            for name, updates in patch.get("update", {}).items():
                e = ENTITY_BY_NAME[name]
                for rid, changes in updates.items():
                    self.update(e, parse_id(e, rid), changes)
            for name, ids in patch.get("delete", {}).items():
                e = ENTITY_BY_NAME[name]
                for rid in ids:
                    self.delete(e, parse_id(e, rid))
            self.conn.execute("COMMIT")
        except Exception:
            self.conn.execute("ROLLBACK")
            raise

    # -- reads
    def get(self, e: Entity, n: int) -> dict[str, Any] | None:
        row = self.conn.execute(f"SELECT * FROM {e.table} WHERE n = ?", (n,)).fetchone()
        return CONVERTERS[e.name](row) if row else None

    # -- writes (each records a diff entry)
    def insert(self, e: Entity, row: dict[str, Any]) -> str:
        names = [f.name for f in e.fields]
        n = row.get("n")
        if n is None:
            cur = self.conn.execute(
                f"INSERT INTO {e.table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                tuple(to_sql(f, row.get(f.name)) for f in e.fields),
            )
            n = cur.lastrowid
        else:
            self.conn.execute(
                f"INSERT INTO {e.table} (n, {', '.join(names)}) VALUES (?, {', '.join('?' * len(names))})",
                (n, *(to_sql(f, row.get(f.name)) for f in e.fields)),
            )
        after = self.get(e, n)
        self.diff.append({"table": e.table, "id": after["id"], "before": None, "after": after})
        return after["id"]

    def update(self, e: Entity, n: int, changes: dict[str, Any]) -> dict[str, Any]:
        before = self.get(e, n)
        sets = ", ".join(f"{k} = ?" for k in changes)
        vals = [to_sql(e.field(k), v) for k, v in changes.items()]
        self.conn.execute(f"UPDATE {e.table} SET {sets} WHERE n = ?", (*vals, n))
        after = self.get(e, n)
        if before != after:
            self.diff.append({"table": e.table, "id": after["id"], "before": before, "after": after})
        return after

    def delete(self, e: Entity, n: int) -> dict[str, Any]:
        before = self.get(e, n)
        self.conn.execute(f"DELETE FROM {e.table} WHERE n = ?", (n,))
        self.diff.append({"table": e.table, "id": before["id"], "before": before, "after": None})
        return before

    def set_device(self, key: str, value: Any) -> None:
        before = self.device.get(key)
        if before == value and key in self.device:
            return
        self.conn.execute("INSERT OR REPLACE INTO device VALUES (?, ?)", (key, json.dumps(value)))
        self.device[key] = value
        self.diff.append({"table": "device", "id": key, "before": None if before is None else {"value": before},
                          "after": {"value": value}})

    # -- whole-state views
    def dump(self, tables: "set[str] | None" = None) -> dict[str, dict[str, dict[str, Any]]]:
        """Rows of every table (or of `tables`) keyed by table then id (device keys as ids)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        if tables is None or "device" in tables:
            out["device"] = {k: {"value": json.loads(v)} for k, v in self.conn.execute("SELECT key, value FROM device")}
        for e in ENTITIES:
            if tables is not None and e.table not in tables:
                continue
            conv = CONVERTERS[e.name]
            out[e.table] = {r["id"]: r for r in map(conv, self.conn.execute(f"SELECT * FROM {e.table}"))}
        return out

    def close(self) -> None:
        self.conn.close()


def diff_states(a: dict[str, dict[str, dict[str, Any]]], b: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Row-level changes from state dump `a` to `b`, in a canonical order."""
    out = []
    for table in sorted(set(a) | set(b)):
        ra, rb = a.get(table, {}), b.get(table, {})
        for rid in sorted(set(ra) | set(rb)):
            x, y = ra.get(rid), rb.get(rid)
            if x != y:
                out.append({"table": table, "id": rid, "before": x, "after": y})
    return out


def apply_diff(world: World, diffs: Iterable[dict[str, Any]]) -> None:
    """Replay recorded diffs onto `world` (used to check that the ledger reproduces the state)."""
    for d in diffs:
        if d["table"] == "device":
            world.set_device(d["id"], d["after"]["value"])
            continue
        e = ENTITY_BY_TABLE[d["table"]]
        n = parse_id(e, d["id"])
        if d["after"] is None:
            world.delete(e, n)
        elif d["before"] is None:
            row = {k: v for k, v in d["after"].items() if k != "id"}
            row["n"] = n
            world.insert(e, row)
        else:
            world.update(e, n, {k: v for k, v in d["after"].items() if k != "id"})
