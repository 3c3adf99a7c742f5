"""LLM-simulated environments: the long tail of apps the sandbox has no handlers for (DESIGN §4).

A catalog of apps (smart home, social, wearables, car, pets, ...) declares entities with typed fields; each
entity gets list/get/create/update/delete tools (ToolSpecs with strict JSON-Schema parameters) and a
state table in a real SQLite store. A tool call is answered by a simulator model through any planner
backend (`backend(prompt) -> str`): the prompt holds the tool spec, the task context, the app's current
rows and the ledger of earlier calls; the reply must be one JSON object

    {"status": "ok"|"error", "result": ..., "error_code": "...", "message": "...",
     "delta": [{"op": "insert"|"update"|"delete", "table": T, "id": ID, "row"|"changes": {...}}]}

validated against a schema, then semantically: the delta's tables, ids and field types must fit the
store, a read tool must not write, and what a read returns must equal the stored rows (so later reads
agree with earlier writes). A valid delta is applied in one SQLite transaction. Replies are cached by
(tool, canonical arguments, state hash). An invalid reply is retried (`max_retries`), then the call is
INFRA and the episode infra. Simulated tasks are for training only: `reset` refuses tasks of the dev/test
splits and `refuse_simulated` keeps simulated trajectories out of benchmark scores.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import sqlite3
from typing import Any, Callable, Iterable

from mpa_jax.envs.contract import (Action, Check, ErrorCode, Feedback, Task, ToolSpec, Verification, canonical_json)
from mpa_jax.envs.schema import SchemaError, compile_schema

Backend = Callable[[str], str]


# ---------------------------------------------------------------------------------------------- catalog
@dataclasses.dataclass(frozen=True)
class SimField:
    name: str
    type: str  # "str" | "int" | "float" | "bool" | "enum"
    enum: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None

    def schema(self) -> dict[str, Any]:
        if self.type == "enum":
            return {"type": "string", "enum": list(self.enum)}
        if self.type == "bool":
            return {"type": "boolean"}
        s: dict[str, Any] = {"type": {"int": "integer", "float": "number"}.get(self.type, "string")}
        if self.type == "str":
            s.update(minLength=1, maxLength=200)
        if self.lo is not None:
            s["minimum"] = self.lo
        if self.hi is not None:
            s["maximum"] = self.hi
        return s

    def check(self, v: Any) -> bool:
        if self.type == "bool":
            return isinstance(v, bool)
        if self.type == "int":
            return isinstance(v, int) and not isinstance(v, bool) and (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)
        if self.type == "float":
            return isinstance(v, (int, float)) and not isinstance(v, bool) and (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)
        if self.type == "enum":
            return v in self.enum
        return isinstance(v, str) and 0 < len(v) <= 200


@dataclasses.dataclass(frozen=True)
class SimEntity:
    app: str
    domain: str
    name: str  # singular, e.g. "light"
    label: str
    fields: tuple[SimField, ...]

    @property
    def table(self) -> str:
        return f"{self.app}_{self.name}s"

    def field(self, name: str) -> SimField | None:
        return next((f for f in self.fields if f.name == name), None)


def _F(spec: str) -> SimField:
    """Compact field spec: "name:str", "on:bool", "level:int:0:100", "mode:enum:heat|cool|off"."""
    parts = spec.split(":")
    name, typ = parts[0], parts[1]
    if typ == "enum":
        return SimField(name, "enum", tuple(parts[2].split("|")))
    lo = float(parts[2]) if len(parts) > 2 else None
    hi = float(parts[3]) if len(parts) > 3 else None
    if typ == "int":
        lo, hi = (int(lo) if lo is not None else None), (int(hi) if hi is not None else None)
    return SimField(name, typ, (), lo, hi)


_APPS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    # app: (domain, {entity: (label, "field field ...")})
    "smarthome": ("device_settings", {
        "light": ("smart light", "name:str room:str on:bool brightness:int:0:100"),
        "thermostat": ("thermostat", "name:str room:str target_c:float:5:35 mode:enum:heat|cool|auto|off"),
        "lock": ("door lock", "name:str locked:bool"),
        "camera": ("security camera", "name:str recording:bool"),
        "plug": ("smart plug", "name:str room:str on:bool"),
        "scene": ("home scene", "name:str active:bool"),
        "blind": ("window blind", "name:str room:str open_pct:int:0:100"),
        "vacuum": ("robot vacuum", "name:str status:enum:docked|cleaning|paused"),
    }),
    "social": ("communication", {
        "post": ("social post", "text:str visibility:enum:public|friends|private likes:int:0:1000000"),
        "friend": ("friend", "name:str status:enum:friend|pending|blocked"),
        "group": ("social group", "name:str muted:bool"),
        "event": ("social event", "title:str date:str going:bool"),
    }),
    "wearables": ("health_fitness", {
        "watchface": ("watch face", "name:str active:bool"),
        "goal": ("activity goal", "metric:enum:steps|calories|active_minutes target:int:1:100000"),
        "alert": ("health alert", "metric:enum:heart_rate|spo2|stress threshold:int:1:300 enabled:bool"),
        "band": ("wearable band", "name:str battery_pct:int:0:100 connected:bool"),
    }),
    "car": ("navigation_rides", {
        "vehicle": ("connected car", "name:str locked:bool climate_on:bool charge_pct:int:0:100"),
        "charge_session": ("charging session", "station:str kwh:float:0:500 status:enum:scheduled|charging|done"),
    }),
    "pets": ("utilities", {
        "pet": ("pet", "name:str species:enum:dog|cat|bird|fish fed:bool"),
        "vet_visit": ("vet visit", "pet:str date:str reason:str"),
    }),
    "garden": ("utilities", {
        "plant": ("plant", "name:str location:str watered:bool"),
        "sprinkler": ("sprinkler zone", "zone:str on:bool minutes:int:0:240"),
    }),
    "school": ("notes_files", {
        "assignment": ("school assignment", "course:str title:str due:str done:bool"),
        "course": ("course", "title:str teacher:str"),
    }),
    "library": ("media", {
        "loan": ("library loan", "title:str due:str renewed:bool"),
    }),
    "budget": ("payments_banking", {
        "category": ("budget category", "name:str limit_usd:float:0:1000000 spent_usd:float:0:1000000"),
    }),
    "tickets": ("travel", {
        "ticket": ("event ticket", "event:str date:str seats:int:1:20 status:enum:held|booked|cancelled"),
    }),
}

SIM_ENTITIES: tuple[SimEntity, ...] = tuple(
    SimEntity(app, domain, name, label, tuple(_F(s) for s in fields.split()))
    for app, (domain, ents) in _APPS.items() for name, (label, fields) in ents.items()
)
SIM_BY_TABLE = {e.table: e for e in SIM_ENTITIES}
SIM_OPS = ("list", "get", "create", "update", "delete")


def _row_schema(e: SimEntity, required: bool = True) -> dict[str, Any]:
    props = {"id": {"type": "string"}, **{f.name: f.schema() for f in e.fields}}
    return {"type": "object", "properties": props, "required": ["id", *(f.name for f in e.fields)] if required else ["id"],
            "additionalProperties": False}


def _tool_spec(e: SimEntity, op: str) -> ToolSpec:
    fields = {f.name: f.schema() for f in e.fields}
    obj = lambda props, req: {"type": "object", "properties": props, "required": req, "additionalProperties": False}  # noqa: E731
    idp = {"id": {"type": "string", "description": f"{e.label} id", "minLength": 1, "maxLength": 64}}
    if op == "list":
        params = obj({"query": {"type": "string", "maxLength": 200}}, [])
        returns = {"type": "object", "properties": {"items": {"type": "array", "items": _row_schema(e)}},
                   "required": ["items"], "additionalProperties": False}
        desc = f"List {e.label}s (optionally those whose text fields contain `query`)."
    elif op == "get":
        params, returns, desc = obj(idp, ["id"]), _row_schema(e), f"Get one {e.label} by id."
    elif op == "create":
        params = obj(fields, [e.fields[0].name])
        returns, desc = _row_schema(e), f"Create a {e.label}."
    elif op == "update":
        params = obj({**idp, **fields}, ["id"])
        returns, desc = _row_schema(e), f"Change fields of a {e.label}."
    else:
        params = obj(idp, ["id"])
        returns = {"type": "object", "properties": {"deleted": {"type": "string"}}, "required": ["deleted"],
                   "additionalProperties": False}
        desc = f"Delete a {e.label}."
    return ToolSpec(name=f"{e.app}_{op}_{e.name}", app=e.app, domain=e.domain, description=desc, parameters=params,
                    returns=returns, kind="read" if op in ("list", "get") else "write", errors=["NOT_FOUND"])


@dataclasses.dataclass(frozen=True)
class SimTool:
    spec: ToolSpec
    entity: SimEntity
    op: str
    validate: Callable[[Any], None]
    validate_result: Callable[[Any], None]


SIM_TOOLS: dict[str, SimTool] = {}
for _e in SIM_ENTITIES:
    for _op in SIM_OPS:
        _s = _tool_spec(_e, _op)
        SIM_TOOLS[_s.name] = SimTool(_s, _e, _op, compile_schema(_s.parameters), compile_schema(_s.returns))

REPLY_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "error"]},
        "result": {},
        "error_code": {"type": "string", "enum": ["NOT_FOUND", "INVALID_ARGUMENTS", "PRECONDITION_FAILED", "AMBIGUOUS"]},
        "message": {"type": "string", "maxLength": 500},
        "delta": {"type": "array", "maxItems": 20, "items": {
            "type": "object",
            "properties": {"op": {"type": "string", "enum": ["insert", "update", "delete"]}, "table": {"type": "string"},
                           "id": {"type": "string", "minLength": 1, "maxLength": 64},
                           "row": {"type": "object"}, "changes": {"type": "object"}},
            "required": ["op", "table", "id"], "additionalProperties": False}},
    },
    "required": ["status", "delta"],
    "additionalProperties": False,
}
_validate_reply = compile_schema(REPLY_SCHEMA)


class InvalidReply(ValueError):
    """The simulator's reply broke the schema or disagreed with the state store; the message says how."""


# ---------------------------------------------------------------------------------------------- state store
class SimState:
    """The simulated apps' state: one SQLite table per entity (id, row JSON), transactional deltas."""

    def __init__(self) -> None:
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


# ---------------------------------------------------------------------------------------------- prompt
def simulator_prompt(tool: SimTool, args: dict[str, Any], task: Task, state: SimState, ledger: list[dict[str, Any]]) -> str:
    """The simulator's prompt. Machine-read sections are one JSON line each (`CALL:`, `STATE:`)."""
    recent = [{k: e[k] for k in ("name", "arguments", "status", "result") if k in e} for e in ledger[-8:]]
    return "\n".join([
        "You simulate a phone app's backend. Answer the tool call below as the app would, consistently with the"
        " app state and the earlier calls. Reply with exactly one JSON object and nothing else:",
        '{"status": "ok"|"error", "result": <object matching RETURNS>, "error_code": "NOT_FOUND"|...,'
        ' "message": "...", "delta": [{"op": "insert"|"update"|"delete", "table": "...", "id": "...",'
        ' "row"|"changes": {...}}]}',
        "Reads never write (empty delta). A write's delta says exactly what changed. New ids: <entity>_<n>.",
        f"TASK: {task.instruction}",
        "TOOL: " + canonical_json(tool.spec.to_openai()["function"]),
        "RETURNS: " + canonical_json(tool.spec.returns),
        "STATE: " + canonical_json({"table": tool.entity.table, "rows": state.rows(tool.entity.table)}),
        "LEDGER: " + canonical_json(recent),
        "CALL: " + canonical_json({"name": tool.spec.name, "arguments": args}),
    ])


def parse_reply(text: str) -> dict[str, Any]:
    """The reply's JSON object (a ```json fence or surrounding prose is tolerated); InvalidReply otherwise."""
    if not isinstance(text, str):
        raise InvalidReply(f"the backend returned {type(text).__name__}, not text")
    m = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    body = m.group(1) if m else text[text.find("{"): text.rfind("}") + 1] if "{" in text else ""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, ValueError) as e:
        raise InvalidReply(f"reply is not a JSON object: {e}") from None
    try:
        _validate_reply(obj)
    except SchemaError as e:
        raise InvalidReply(f"reply breaks the schema: {e}") from None
    return obj


# ---------------------------------------------------------------------------------------------- backends
class DeterministicSimulator:
    """A rule-based simulator with the model's interface (`prompt -> reply`): reads the prompt's CALL and
    STATE lines and answers what a faithful simulator would. Tests and benches use it; `garbage_every=k`
    makes every k-th reply garbage (format robustness)."""

    def __init__(self, garbage_every: int = 0) -> None:
        self.calls = 0
        self.garbage_every = garbage_every

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        if self.garbage_every and self.calls % self.garbage_every == 0:
            return "Sure! Here is the result: {status: ok"
        line = lambda tag: json.loads(next(x for x in prompt.split("\n") if x.startswith(tag))[len(tag):])  # noqa: E731
        call, st = line("CALL: "), line("STATE: ")
        tool = SIM_TOOLS[call["name"]]
        e, args, rows, table = tool.entity, call["arguments"], st["rows"], st["table"]
        if tool.op == "list":
            q = str(args.get("query", "")).lower()
            items = [r for r in rows.values() if not q or any(q in str(v).lower() for k, v in r.items() if k != "id")]
            return json.dumps({"status": "ok", "result": {"items": items}, "delta": []})
        if tool.op == "create":
            n = 1 + max([int(i.rsplit("_", 1)[1]) for i in rows if i.rsplit("_", 1)[-1].isdigit()] or [0])
            rid = f"{e.name}_{n}"
            row = {f.name: args.get(f.name, _default(f)) for f in e.fields}
            return json.dumps({"status": "ok", "result": {"id": rid, **row},
                               "delta": [{"op": "insert", "table": table, "id": rid, "row": row}]})
        rid = args["id"]
        if rid not in rows:
            return json.dumps({"status": "error", "error_code": "NOT_FOUND", "message": f"no {e.label} {rid!r}", "delta": []})
        if tool.op == "get":
            return json.dumps({"status": "ok", "result": rows[rid], "delta": []})
        if tool.op == "update":
            changes = {k: v for k, v in args.items() if k != "id"}
            if not changes:
                return json.dumps({"status": "ok", "result": rows[rid], "delta": []})
            return json.dumps({"status": "ok", "result": {**rows[rid], **changes},
                               "delta": [{"op": "update", "table": table, "id": rid, "changes": changes}]})
        return json.dumps({"status": "ok", "result": {"deleted": rid}, "delta": [{"op": "delete", "table": table, "id": rid}]})


def _default(f: SimField) -> Any:
    return {"bool": False, "int": int(f.lo or 0), "float": float(f.lo or 0.0)}.get(f.type, f.enum[0] if f.enum else "unnamed")


BACKENDS: dict[str, Callable[[], Backend]] = {"deterministic": DeterministicSimulator}


def engine_backend(engine: Any, tokenizer: Any, sampling: Any) -> Backend:
    """Any planner backend as a simulator: a RolloutEngine (`generate(prompts, params)`) and a tokenizer
    (`encode`/`decode`). The prompt is sent as one user turn of plain text; no jax is imported here."""

    def call(prompt: str) -> str:
        ids = tokenizer.encode(prompt)
        out = engine.generate([ids], sampling)[0]
        if getattr(out, "error", ""):
            raise RuntimeError(f"engine error: {out.error}")
        return tokenizer.decode(out.token_ids)

    return call


# ---------------------------------------------------------------------------------------------- env
class SimCache:
    """Replies cached by (tool, canonical arguments, state hash); shareable between envs."""

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


class SimulatedEnv:
    """The env protocol over simulated apps. `backend` is a callable or a name in BACKENDS."""

    kind = "simulated"

    def __init__(self, backend: Backend | str = "deterministic", max_retries: int = 2, cache: SimCache | None = None) -> None:
        self.backend: Backend = BACKENDS[backend]() if isinstance(backend, str) else backend
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ValueError(f"unknown simulator backend {backend!r}")
        self.max_retries = int(max_retries)
        self.cache = cache if cache is not None else SimCache()
        self.state = SimState()
        self.task: Task | None = None
        self.ledger: list[dict[str, Any]] = []
        self.final_message: str | None = None
        self.infra = ""
        self.backend_calls = self.invalid_replies = 0

    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return [SIM_TOOLS[n].spec for n in task.tools if n in SIM_TOOLS]

    def reset(self, task: Task) -> dict[str, Any]:
        if task.split != "train" or task.metadata.get("env") != "simulated":
            raise ValueError(f"task {task.id}: simulated envs run simulated training tasks only (split {task.split!r});"
                             " the benchmark never scores simulated episodes")
        self.task, self.ledger, self.final_message, self.infra = task, [], None, ""
        self.state.load(task.metadata.get("sim_state", {}))
        system = ("You are a phone assistant with access to the user's connected apps. Use the tools to act;"
                  " finish with one short message to the user.")
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}],
                "tools": [s.to_openai() for s in self.tool_specs(task)]}

    def step(self, action: Any) -> Feedback:
        call_id = getattr(action, "call_id", "") or f"call_{len(self.ledger)}"
        if self.task is None:
            return Feedback.error(ErrorCode.INFRA, "reset(task) must be called before step()", call_id)
        if self.infra:
            return Feedback.error(ErrorCode.INFRA, f"episode abandoned: {self.infra}", call_id)
        if not isinstance(action, Action):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"expected an Action, got {type(action).__name__}", call_id)
        if action.kind in ("message", "finish"):
            if action.kind == "message":
                if not str(action.text).strip():
                    return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "a message needs non-empty text", call_id)
                self.final_message = action.text
            self.ledger.append({"type": action.kind, "text": action.text, "call_id": call_id})
            return Feedback(call_id=call_id, status="ok", result={"episode": "ended"})
        tool = SIM_TOOLS.get(action.name)
        if action.kind != "tool_call" or tool is None or action.name not in self.task.tools:
            return self._error(call_id, action, ErrorCode.UNKNOWN_TOOL, f"unknown tool {action.name!r}")
        try:
            tool.validate(action.arguments)
        except SchemaError as e:
            return self._error(call_id, action, ErrorCode.INVALID_ARGUMENTS, str(e))
        return self._simulate(call_id, tool, action.arguments)

    def _error(self, call_id: str, action: Action, code: ErrorCode, message: str) -> Feedback:
        self.ledger.append({"type": "tool_call", "name": action.name, "arguments": action.arguments, "call_id": call_id,
                            "status": "error", "error_code": code.value, "message": message, "diff": []})
        return Feedback.error(code, message, call_id)

    def _simulate(self, call_id: str, tool: SimTool, args: dict[str, Any]) -> Feedback:
        key = (tool.spec.name, canonical_json(args), self.state.state_hash())
        reply = self.cache.get(key)
        problem = ""
        if reply is None:
            prompt = simulator_prompt(tool, args, self.task, self.state, self.ledger)
            for _attempt in range(1 + self.max_retries):
                self.backend_calls += 1
                try:
                    reply = self._check(tool, args, parse_reply(self.backend(prompt)))
                    break
                except InvalidReply as e:
                    problem, reply = str(e), None
                except Exception as e:  # noqa: BLE001 - a backend failure (HTTP, engine) is retried, then INFRA
                    problem, reply = f"backend failed: {type(e).__name__}: {e}", None
                self.invalid_replies += 1
            if reply is None:
                self.infra = f"simulator gave no valid reply in {1 + self.max_retries} attempts: {problem}"
                return Feedback.error(ErrorCode.INFRA, self.infra, call_id)
            self.cache.put(key, reply)
        diffs = self.state.apply(reply["delta"])
        ok = reply["status"] == "ok"
        entry = {"type": "tool_call", "name": tool.spec.name, "arguments": args, "call_id": call_id,
                 "status": reply["status"], "result": reply.get("result"), "diff": diffs}
        self.ledger.append(entry)
        if ok:
            return Feedback(call_id=call_id, status="ok", result=reply.get("result"))
        return Feedback.error(ErrorCode(reply.get("error_code", "NOT_FOUND")), reply.get("message", ""), call_id)

    def _check(self, tool: SimTool, args: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """Semantic validation against the tool and the store; returns the reply or raises InvalidReply."""
        delta = reply["delta"]
        if any(d["table"] != tool.entity.table for d in delta):
            raise InvalidReply(f"{tool.spec.name} may only change {tool.entity.table}")
        self.state.check_delta(delta)
        if reply["status"] == "error":
            if delta:
                raise InvalidReply("an error reply must not change state")
            if "error_code" not in reply:
                raise InvalidReply("an error reply needs error_code")
            return reply
        if "result" not in reply:
            raise InvalidReply("an ok reply needs result")
        try:
            tool.validate_result(reply["result"])
        except SchemaError as e:
            raise InvalidReply(f"result breaks {tool.spec.name}'s RETURNS schema: {e}") from None
        rows, res, op = self.state.rows(tool.entity.table), reply["result"], tool.op
        if op in ("list", "get"):
            if delta:
                raise InvalidReply(f"{tool.spec.name} is a read and must not change state")
            for item in res["items"] if op == "list" else [res]:
                if rows.get(item["id"]) != item:
                    raise InvalidReply(f"result row {item['id']!r} disagrees with the state store")
            if op == "get" and res["id"] != args["id"]:
                raise InvalidReply(f"get returned {res['id']!r}, asked for {args['id']!r}")
            return reply
        want_op = {"create": "insert", "update": "update", "delete": "delete"}[op]
        if op != "update" or len(args) > 1:
            if len(delta) != 1 or delta[0]["op"] != want_op:
                raise InvalidReply(f"{tool.spec.name} must answer exactly one {want_op} delta")
        if op == "create":
            d = delta[0]
            if {**d["row"], "id": d["id"]} != res or any(res.get(k) != v for k, v in args.items()):
                raise InvalidReply("create's result must be the inserted row, with the given arguments")
        elif op == "update":
            if args["id"] not in rows:
                raise InvalidReply(f"update of missing id {args['id']!r} must be a NOT_FOUND error")
            changes = {k: v for k, v in args.items() if k != "id"}
            if delta and (delta[0]["id"] != args["id"] or delta[0]["changes"] != changes):
                raise InvalidReply("update's delta must carry exactly the requested changes")
            if res != {**rows[args["id"]], **changes}:
                raise InvalidReply("update's result must be the updated row")
        elif delta[0]["id"] != args["id"] or res != {"deleted": args["id"]}:
            raise InvalidReply("delete must delete the requested id and answer it")
        return reply

    def verify(self) -> Verification:
        """Goals over the end state (field values, new rows), nothing else changed, and a final message."""
        if self.task is None or self.infra:
            return Verification(success=False, score=0.0, infra_error=True)
        v = self.task.verifier
        start = self.task.metadata.get("sim_state", {})
        end = self.state.dump()
        checks, covered = [], set()
        for g in v.get("goals", []):
            table = g["table"]
            if g["kind"] == "field":
                row = end.get(table, {}).get(g["id"])
                ok = row is not None and all(row.get(k) == x for k, x in g["values"].items())
                covered.add((table, g["id"]))
                checks.append(Check(g.get("name", "field"), ok, f"{table}/{g['id']} {g['values']}"))
            elif g["kind"] == "new_row":
                hits = [rid for rid, r in end.get(table, {}).items()
                        if rid not in start.get(table, {}) and all(r.get(k) == x for k, x in g["match"].items())]
                covered.update((table, h) for h in hits)
                checks.append(Check(g.get("name", "new_row"), len(hits) == 1, f"{len(hits)} new row(s) match"))
            elif g["kind"] == "deleted":
                covered.add((table, g["id"]))
                checks.append(Check(g.get("name", "deleted"), g["id"] not in end.get(table, {}), f"{table}/{g['id']} gone"))
        stray = [(t, rid) for t in set(start) | set(end) for rid in set(start.get(t, {})) | set(end.get(t, {}))
                 if start.get(t, {}).get(rid) != end.get(t, {}).get(rid) and (t, rid) not in covered]
        checks.append(Check("nothing_else_changed", not stray, f"{len(stray)} other row(s) changed"))
        checks.append(Check("final_message", bool(self.final_message), "a final message was sent"))
        passed = sum(c.weight for c in checks if c.passed)
        total = sum(c.weight for c in checks)
        success = all(c.passed for c in checks)
        return Verification(success=success, score=1.0 if success else round(passed / total, 4), checks=checks)

    def close(self) -> None:
        self.state.close()


# ---------------------------------------------------------------------------------------------- tasks
def _seed_rows(rng: random.Random) -> dict[str, dict[str, dict[str, Any]]]:
    names = ["Kitchen", "Hallway", "Porch", "Office", "Garage", "Bedroom", "Den"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for e in SIM_ENTITIES:
        rows = {}
        for n in range(1, 4):
            row = {}
            for f in e.fields:
                if f.type == "bool":
                    row[f.name] = rng.random() < 0.5
                elif f.type == "enum":
                    row[f.name] = rng.choice(f.enum)
                elif f.type in ("int", "float"):
                    lo, hi = int(f.lo or 0), int(min(f.hi or 100, 100))
                    row[f.name] = rng.randint(lo, hi) if f.type == "int" else float(rng.randint(lo, hi))
                else:
                    row[f.name] = f"{rng.choice(names)} {e.label} {n}" if f.name in ("name", "title") else rng.choice(names)
            rows[f"{e.name}_{n}"] = {**row, "id": f"{e.name}_{n}"}
        out[e.table] = rows
    return out


def simulated_tasks(n: int, seed: int = 0) -> list[Task]:
    """`n` training tasks over the simulated apps: change a field, create a row, or delete a row."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        state = _seed_rows(random.Random(rng.random()))
        e = SIM_ENTITIES[i % len(SIM_ENTITIES)]
        rows = state[e.table]
        rid = rng.choice(sorted(rows))
        kind = ("update", "create", "delete")[i % 3]
        label = rows[rid].get("name") or rows[rid].get("title") or rid
        editable = [f for f in e.fields if f.type in ("bool", "enum", "int")]
        if kind == "update" and editable:
            f = rng.choice(editable)
            cur = rows[rid][f.name]
            new = (not cur) if f.type == "bool" else rng.choice([x for x in f.enum if x != cur] or [cur]) if f.type == "enum" \
                else int(min(f.hi or 100, max(f.lo or 0, (cur or 0) + rng.randint(1, 9))))
            instruction = f"Set {f.name.replace('_', ' ')} of the {e.label} {label!r} to {json.dumps(new)}."
            goals = [{"kind": "field", "table": e.table, "id": rid, "values": {f.name: new}, "name": "changed"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_list_{e.name}", "arguments": {}},
                    {"kind": "tool_call", "name": f"{e.app}_update_{e.name}", "arguments": {"id": rid, f.name: new}}]
        elif kind == "delete" or not editable:
            instruction = f"Remove the {e.label} {label!r}."
            goals = [{"kind": "deleted", "table": e.table, "id": rid, "name": "deleted"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_list_{e.name}", "arguments": {}},
                    {"kind": "tool_call", "name": f"{e.app}_delete_{e.name}", "arguments": {"id": rid}}]
        else:
            first = e.fields[0]
            value = f"New {e.label} {i}" if first.type == "str" else rows[rid][first.name]
            instruction = f"Add a {e.label} with {first.name} {json.dumps(value)}."
            goals = [{"kind": "new_row", "table": e.table, "match": {first.name: value}, "name": "created"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_create_{e.name}", "arguments": {first.name: value}}]
        gold.append({"kind": "message", "text": "Done."})
        tools = [f"{e.app}_{op}_{e.name}" for op in SIM_OPS]
        tasks.append(Task(id=f"sim/{e.table}.{kind}/{seed}-{i}", domain=e.domain, category="tool_use", difficulty=1,
                          instruction=instruction, tools=tools, verifier={"goals": goals}, gold=gold,
                          template=f"sim.{e.name}.{kind}", split="train", seed=seed * 100_003 + i,
                          metadata={"env": "simulated", "sim_state": state}))
    return tasks


def run_gold(env: SimulatedEnv, task: Task) -> Verification:
    """Replay a simulated task's gold calls (its quality check and the oracle for tests)."""
    env.reset(task)
    for g in task.gold:
        env.step(Action.tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else Action.message(g["text"]))
    return env.verify()


def refuse_simulated(trajectories: Iterable[Any]) -> None:
    """Raise ValueError if any trajectory came from a simulated env: benchmark scores never include them."""
    for t in trajectories:
        prov = getattr(t, "provenance", {}) or {}
        if prov.get("env") == "simulated" or str(getattr(t, "task_id", "")).startswith("sim/"):
            raise ValueError(f"trajectory {getattr(t, 'task_id', '?')}: simulated episodes are for training only and"
                             " never count in benchmark scores")
