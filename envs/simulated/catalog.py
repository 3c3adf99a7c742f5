"""The simulated apps' catalog: entities with typed fields, and their list/get/create/update/delete tools.

Each entity (a smart light, a social post, a vet visit, ...) gets five ToolSpecs with strict JSON-Schema
parameters and returns, and one state table in the store (`SimEntity.table`). The tool specs here are what
the policy sees; the same fields type-check the deltas a simulator reply proposes (`SimField.check`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from mpa_jax.envs.contract import ToolSpec
from mpa_jax.envs.schema import compile_schema


@dataclasses.dataclass(frozen=True)
class SimField:
    """One typed field of an entity: its JSON Schema in tool specs, and `check` for values a delta writes."""

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
    """An app's entity (a smart light, a post, ...): its typed fields and its store table."""

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
    """A stored row of `e` as JSON Schema (id and every field required, or only the id)."""
    props = {"id": {"type": "string"}, **{f.name: f.schema() for f in e.fields}}
    return {"type": "object", "properties": props, "required": ["id", *(f.name for f in e.fields)] if required else ["id"],
            "additionalProperties": False}


def _tool_spec(e: SimEntity, op: str) -> ToolSpec:
    """The ToolSpec of `op` on `e`: list/get are reads, create/update/delete writes."""
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
    """A catalog tool: its spec, the entity and op it acts on, and its compiled argument / result validators."""

    spec: ToolSpec
    entity: SimEntity
    op: str
    validate: Callable[[Any], None]
    validate_result: Callable[[Any], None]


# Validators are compiled once, here: every step checks its arguments and every ok reply its result.
SIM_TOOLS: dict[str, SimTool] = {}
for _e in SIM_ENTITIES:
    for _op in SIM_OPS:
        _s = _tool_spec(_e, _op)
        SIM_TOOLS[_s.name] = SimTool(_s, _e, _op, compile_schema(_s.parameters), compile_schema(_s.returns))
