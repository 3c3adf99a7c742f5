"""The sandbox's tools: ToolSpecs plus executors, generated from the catalog or written as handlers.

Table tools (search/get/create/update/delete per entity) are generated from `catalog.ENTITIES`; the rest
(messaging, routes, payments, unit conversion, device settings, ...) are handlers below. An executor is
`fn(world, args) -> result`; it raises `ToolError` for typed failures. Validation and preconditions are
run by the sandbox pipeline before the executor (see sandbox.py).
"""
from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import operator
from typing import Any, Callable

from mpa_jax.envs.catalog import CITIES, ENTITIES, ENTITY_BY_NAME, Entity, Field
from mpa_jax.envs.contract import ErrorCode, ToolSpec
from mpa_jax.envs.schema import compile_schema
from mpa_jax.envs.world import CONVERTERS, World, parse_id, stable_hash

TRANSFER_LIMIT = 2000.0


class ToolError(Exception):
    """A typed tool failure; becomes an error Feedback."""

    def __init__(self, code: ErrorCode, message: str, hint: str = "", result: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.hint, self.result = code, message, hint, result


@dataclasses.dataclass
class Tool:
    spec: ToolSpec
    run: Callable[[World, dict[str, Any]], Any]
    validate: Callable[[Any], None]
    preconditions: tuple[str, ...]
    entity: Entity | None = None
    op: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind


TOOLS: dict[str, Tool] = {}


def _register(spec: ToolSpec, run: Callable, entity: Entity | None = None, op: str = "") -> None:
    if spec.name in TOOLS:
        raise ValueError(f"duplicate tool {spec.name}")
    TOOLS[spec.name] = Tool(spec, run, compile_schema(spec.parameters), tuple(spec.preconditions), entity, op)


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _field_schema(f: Field) -> dict[str, Any]:
    d: dict[str, Any] = {"description": f.words}
    if f.ref:
        d.update(type="string", pattern=f"^{f.ref}_[0-9]+$", description=f"id of the {ENTITY_BY_NAME[f.ref].label}")
    elif f.type == "int":
        d["type"] = "integer"
    elif f.type == "num":
        d["type"] = "number"
    elif f.type == "bool":
        d["type"] = "boolean"
    elif f.type == "enum":
        d.update(type="string", enum=list(f.enum))
    elif f.type == "date":
        d.update(type="string", pattern=r"^\d{4}-\d{2}-\d{2}$", description=f"{f.words} (YYYY-MM-DD)")
    elif f.type == "time":
        d.update(type="string", pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description=f"{f.words} (HH:MM, 24h)")
    else:
        d.update(type="string", minLength=1, maxLength=500)
    if f.lo is not None:
        d["minimum"] = f.lo
    if f.hi is not None:
        d["maximum"] = f.hi
    return d


def _id_schema(e: Entity) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{e.name}_[0-9]+$", "description": f"id of the {e.label} (e.g. {e.name}_3)"}


NETWORK = ("network",)


def _pre(e: Entity) -> list[str]:
    return list(NETWORK) if e.online else []


def _not_found(e: Entity, rid: str) -> ToolError:
    return ToolError(ErrorCode.NOT_FOUND, f"no {e.label} with id {rid}", hint=f"use search_{e.plural} to find valid ids")


def _build_entity_tools(e: Entity) -> None:
    app_title = e.app.capitalize()
    conv = CONVERTERS[e.name]
    cols = ", ".join(f.name for f in e.fields)
    if "s" in e.ops:
        where = " OR ".join(f"lower({f}) LIKE ?" for f in e.search)
        summary_sql = f"SELECT n, {', '.join(e.summary)} FROM {e.table} WHERE {where} ORDER BY n LIMIT ? OFFSET ?"
        k = len(e.search)
        summary = e.summary
        prefix = e.name + "_"

        def search(world: World, args: dict[str, Any], sql=summary_sql, k=k, summary=summary, prefix=prefix) -> Any:
            q = "%" + args["query"].strip().lower() + "%"
            take = args.get("limit", 10)
            if world.page_cap is not None:  # a partial-page fault: the service returns a short page
                take = min(take, world.page_cap)
            off = args.get("offset", 0)
            rows = world.conn.execute(sql, (q,) * k + (take + 1, off)).fetchall()
            out: dict[str, Any] = {"results": [{"id": prefix + str(r[0]), **dict(zip(summary, r[1:]))} for r in rows[:take]],
                                   "count": min(len(rows), take)}
            if len(rows) > take:
                out["has_more"] = True
                out["next_offset"] = off + take
            return out

        _register(ToolSpec(
            name=f"search_{e.plural}", app=e.app, domain=e.domain, kind="read", preconditions=_pre(e),
            description=f"{app_title} app: search {e.label}s by text (matches {', '.join(f.replace('_', ' ') for f in e.search)}); returns ids and summaries, one page at a time.",
            parameters=_obj({"query": {"type": "string", "minLength": 1, "maxLength": 100, "description": "text to look for"},
                             "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "max results (default 10)"},
                             "offset": {"type": "integer", "minimum": 0, "maximum": 10000, "description": "skip this many results (for the next page)"}},
                            ["query"]),
            returns={"type": "object", "properties": {"results": {"type": "array"}, "count": {"type": "integer"},
                                                      "has_more": {"type": "boolean"}, "next_offset": {"type": "integer"}}},
            errors=["INVALID_ARGUMENTS", "PRECONDITION_FAILED"] if e.online else ["INVALID_ARGUMENTS"],
        ), search, e, "search")
    if "g" in e.ops:
        get_sql = f"SELECT n, {cols} FROM {e.table} WHERE n = ?"

        def get(world: World, args: dict[str, Any], sql=get_sql, e=e, conv=conv) -> Any:
            row = world.conn.execute(sql, (parse_id(e, args["id"]),)).fetchone()
            if row is None:
                raise _not_found(e, args["id"])
            return conv(row)

        _register(ToolSpec(
            name=f"get_{e.name}", app=e.app, domain=e.domain, kind="read", preconditions=_pre(e),
            description=f"{app_title} app: get every detail of one {e.label} by id.",
            parameters=_obj({"id": _id_schema(e)}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), get, e, "get")
    writable = [f for f in e.fields if not f.derived]
    if "c" in e.ops:

        def create(world: World, args: dict[str, Any], e=e) -> Any:
            row = dict(args)
            for f in e.fields:
                if f.ref:
                    ref_e = ENTITY_BY_NAME[f.ref]
                    ref_row = world.get(ref_e, parse_id(ref_e, args[f.name]))
                    if ref_row is None:
                        raise _not_found(ref_e, args[f.name])
                elif f.derived:
                    src, col = f.derive
                    ref_e = ENTITY_BY_NAME[e.field(src).ref]
                    row[f.name] = world.get(ref_e, parse_id(ref_e, args[src]))[col]
            rid = world.insert(e, row)
            return {"id": rid, "created": world.get(e, parse_id(e, rid))}

        _register(ToolSpec(
            name=f"create_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: create a new {e.label}.",
            parameters=_obj({f.name: _field_schema(f) for f in writable}, [f.name for f in writable if f.req]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), create, e, "create")
    updatable = [f for f in writable if f.updatable]
    if "u" in e.ops:

        def update(world: World, args: dict[str, Any], e=e) -> Any:
            changes = {k: v for k, v in args.items() if k != "id"}
            if not changes:
                raise ToolError(ErrorCode.INVALID_ARGUMENTS, "nothing to update: pass at least one field besides id")
            n = parse_id(e, args["id"])
            if world.get(e, n) is None:
                raise _not_found(e, args["id"])
            return {"updated": world.update(e, n, changes)}

        _register(ToolSpec(
            name=f"update_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: change fields of an existing {e.label}; only the fields given change.",
            parameters=_obj({"id": _id_schema(e), **{f.name: _field_schema(f) for f in updatable}}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), update, e, "update")
    if "d" in e.ops:

        def delete(world: World, args: dict[str, Any], e=e) -> Any:
            n = parse_id(e, args["id"])
            if world.get(e, n) is None:
                raise _not_found(e, args["id"])
            world.delete(e, n)
            return {"deleted": args["id"]}

        _register(ToolSpec(
            name=f"delete_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: delete a {e.label} by id.",
            parameters=_obj({"id": _id_schema(e)}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), delete, e, "delete")


for _e in ENTITIES:
    _build_entity_tools(_e)

# ------------------------------------------------------------------------------------------- handlers

STR = {"type": "string", "minLength": 1, "maxLength": 500}
BOOL = {"type": "boolean"}
LEVEL = {"type": "integer", "minimum": 0, "maximum": 100}


def handler(name: str, app: str, domain: str, kind: str, description: str, params: dict[str, Any],
            required: list[str], pre: tuple[str, ...] = (), errors: tuple[str, ...] = ()):
    def wrap(fn: Callable) -> Callable:
        _register(ToolSpec(name=name, app=app, domain=domain, kind=kind, description=description,  # type: ignore[arg-type]
                           parameters=_obj(params, required), preconditions=list(pre),
                           errors=["INVALID_ARGUMENTS", *errors]), fn)
        return fn
    return wrap


def _now(world: World) -> dt.datetime:
    return dt.datetime.fromisoformat(world.device["now"])


def _resolve_contact(world: World, to: str) -> tuple[str, str]:
    """`to` is a contact id or a phone number; returns (name, number)."""
    e = ENTITY_BY_NAME["contact"]
    if to.startswith("contact_"):
        n = parse_id(e, to)
        row = world.get(e, n) if n is not None else None
        if row is None:
            raise _not_found(e, to)
        return row["name"], row["phone"]
    digits = to.replace("-", "").replace(" ", "")
    if not (digits.startswith("+") and digits[1:].isdigit() or digits.isdigit()) or len(digits) < 7:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"'to' must be a contact id or a phone number, got {to!r}",
                        hint="search_contacts returns contact ids")
    hit = world.conn.execute("SELECT name FROM contacts_contacts WHERE phone = ?", (to,)).fetchone()
    return (hit[0] if hit else ""), to


def _check_blocked(world: World, number: str) -> None:
    if world.conn.execute("SELECT 1 FROM contacts_blocked_numbers WHERE number = ?", (number,)).fetchone():
        raise ToolError(ErrorCode.PERMISSION_DENIED, f"{number} is on the blocked list",
                        hint="unblock it with delete_blocked_number first if the user wants to")


TO = {"type": "string", "minLength": 1, "maxLength": 40, "description": "contact id (contact_N) or phone number"}


@handler("send_sms", "messages", "communication", "write", "Send a text message to a contact id or a phone number.",
         {"to": TO, "body": {"type": "string", "minLength": 1, "maxLength": 1000}}, ["to", "body"],
         pre=("cellular",), errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def send_sms(world: World, a: dict[str, Any]) -> Any:
    name, number = _resolve_contact(world, a["to"])
    _check_blocked(world, number)
    rid = world.insert(ENTITY_BY_NAME["sms"], {"contact_name": name, "to_number": number, "body": a["body"],
                                               "direction": "out", "sent_at": world.device["now"]})
    return {"id": rid, "status": "sent", "to": number}


@handler("make_call", "phone", "communication", "write", "Start a phone call to a contact id or a phone number.",
         {"to": TO}, ["to"], pre=("cellular",), errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def make_call(world: World, a: dict[str, Any]) -> Any:
    name, number = _resolve_contact(world, a["to"])
    _check_blocked(world, number)
    rid = world.insert(ENTITY_BY_NAME["call"], {"contact_name": name, "number": number, "direction": "out",
                                                "duration_s": 0, "at": world.device["now"]})
    return {"id": rid, "status": "calling", "to": number}


EMAIL = {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]+$", "description": "email address"}


@handler("send_email", "email", "communication", "write", "Send an email.",
         {"to": EMAIL, "subject": {"type": "string", "minLength": 1, "maxLength": 200}, "body": {"type": "string", "maxLength": 5000}},
         ["to", "subject", "body"], pre=NETWORK, errors=("PRECONDITION_FAILED",))
def send_email(world: World, a: dict[str, Any]) -> Any:
    rid = world.insert(ENTITY_BY_NAME["email"], {"sender": "me@phone.example", "recipient": a["to"], "subject": a["subject"],
                                                 "body": a["body"], "folder": "sent", "received_at": world.device["now"]})
    return {"id": rid, "status": "sent"}


MODES = {"driving": 45.0, "transit": 28.0, "cycling": 16.0, "walking": 5.0}


def route_km(origin: str, destination: str) -> float:
    a, b = sorted((origin.strip().lower(), destination.strip().lower()))
    return round(1.0 + stable_hash("route", a, b) % 400 / 10.0, 1)


@handler("get_route", "maps", "navigation_rides", "read", "Distance and travel time between two places (names or addresses).",
         {"origin": STR, "destination": STR, "mode": {"type": "string", "enum": list(MODES)}}, ["origin", "destination"],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def get_route(world: World, a: dict[str, Any]) -> Any:
    km = route_km(a["origin"], a["destination"])
    mode = a.get("mode", "driving")
    return {"origin": a["origin"], "destination": a["destination"], "mode": mode, "distance_km": km,
            "duration_min": max(1, round(km / MODES[mode] * 60))}


@handler("get_current_location", "maps", "navigation_rides", "read", "The phone's current city.", {}, [],
         pre=("location",), errors=("PRECONDITION_FAILED",))
def get_current_location(world: World, a: dict[str, Any]) -> Any:
    return {"city": world.device["location"]}


RIDE_MULT = {"standard": 1.0, "comfort": 1.4, "xl": 1.8}


@handler("book_ride", "rides", "navigation_rides", "write", "Book a ride from pickup to dropoff now.",
         {"pickup": STR, "dropoff": STR, "ride_type": {"type": "string", "enum": list(RIDE_MULT)}}, ["pickup", "dropoff", "ride_type"],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def book_ride(world: World, a: dict[str, Any]) -> Any:
    fare = round((4.0 + route_km(a["pickup"], a["dropoff"]) * 1.6) * RIDE_MULT[a["ride_type"]], 2)
    rid = world.insert(ENTITY_BY_NAME["ride"], {"pickup": a["pickup"], "dropoff": a["dropoff"], "ride_type": a["ride_type"],
                                                "status": "booked", "fare": fare})
    return {"id": rid, "status": "booked", "fare": fare}


@handler("cancel_ride", "rides", "navigation_rides", "write", "Cancel a booked ride.",
         {"id": _id_schema(ENTITY_BY_NAME["ride"])}, ["id"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED"))
def cancel_ride(world: World, a: dict[str, Any]) -> Any:
    e = ENTITY_BY_NAME["ride"]
    n = parse_id(e, a["id"])
    row = world.get(e, n)
    if row is None:
        raise _not_found(e, a["id"])
    if row["status"] != "booked":
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"ride {a['id']} is {row['status']}; only booked rides can be cancelled")
    world.update(e, n, {"status": "cancelled"})
    return {"id": a["id"], "status": "cancelled"}


@handler("place_order", "shop", "shopping_food", "write", "Check out: order everything in the shopping cart.", {}, [],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def place_order(world: World, a: dict[str, Any]) -> Any:
    cart_e, prod_e = ENTITY_BY_NAME["cart_item"], ENTITY_BY_NAME["product"]
    items = [CONVERTERS["cart_item"](r) for r in world.conn.execute("SELECT * FROM shop_cart_items ORDER BY n")]
    if not items:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, "the cart is empty", hint="add products with create_cart_item first")
    total = 0.0
    for it in items:
        total += world.get(prod_e, parse_id(prod_e, it["product_id"]))["price"] * it["quantity"]
        world.delete(cart_e, parse_id(cart_e, it["id"]))
    desc = ", ".join(f"{it['product_name']} x{it['quantity']}" for it in items)
    rid = world.insert(ENTITY_BY_NAME["order"], {"items": desc, "total": round(total, 2), "status": "processing",
                                                 "placed_on": world.device["now"][:10]})
    return {"id": rid, "items": desc, "total": round(total, 2), "status": "processing"}


def _account(world: World, rid: str) -> tuple[Entity, int, dict[str, Any]]:
    e = ENTITY_BY_NAME["account"]
    n = parse_id(e, rid)
    row = world.get(e, n)
    if row is None:
        raise _not_found(e, rid)
    return e, n, row


def _debit(world: World, account_id: str, amount: float, description: str, category: str) -> float:
    e, n, acct = _account(world, account_id)
    if acct["balance"] < amount:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"insufficient funds: balance is {acct['balance']:.2f} USD",
                        hint="choose another account or a smaller amount")
    new = round(acct["balance"] - amount, 2)
    world.update(e, n, {"balance": new})
    world.insert(ENTITY_BY_NAME["transaction"], {"description": description, "amount": -round(amount, 2),
                                                 "date": world.device["now"][:10], "category": category})
    return new


@handler("transfer_money", "bank", "payments_banking", "write",
         f"Transfer money from one of the user's accounts to a saved payee (at most {TRANSFER_LIMIT:.0f} USD per transfer).",
         {"from_account_id": _id_schema(ENTITY_BY_NAME["account"]), "payee_id": _id_schema(ENTITY_BY_NAME["payee"]),
          "amount": {"type": "number", "minimum": 0.01, "maximum": 1000000}, "memo": {"type": "string", "maxLength": 140}},
         ["from_account_id", "payee_id", "amount"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def transfer_money(world: World, a: dict[str, Any]) -> Any:
    pe = ENTITY_BY_NAME["payee"]
    payee = world.get(pe, parse_id(pe, a["payee_id"]))
    if payee is None:
        raise _not_found(pe, a["payee_id"])
    if a["amount"] > TRANSFER_LIMIT:
        raise ToolError(ErrorCode.PERMISSION_DENIED, f"transfers above {TRANSFER_LIMIT:.0f} USD are not allowed from the phone",
                        hint="tell the user to use online banking for large transfers")
    new = _debit(world, a["from_account_id"], a["amount"], f"Transfer to {payee['name']}", "bills")
    return {"status": "sent", "amount": round(a["amount"], 2), "payee": payee["name"], "new_balance": new}


@handler("pay_bill", "wallet", "payments_banking", "write", "Pay an unpaid bill from one of the user's accounts.",
         {"bill_id": _id_schema(ENTITY_BY_NAME["bill"]), "from_account_id": _id_schema(ENTITY_BY_NAME["account"])},
         ["bill_id", "from_account_id"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED"))
def pay_bill(world: World, a: dict[str, Any]) -> Any:
    be = ENTITY_BY_NAME["bill"]
    n = parse_id(be, a["bill_id"])
    bill = world.get(be, n)
    if bill is None:
        raise _not_found(be, a["bill_id"])
    if bill["paid"]:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"bill {a['bill_id']} is already paid")
    new = _debit(world, a["from_account_id"], bill["amount"], f"{bill['name']} bill", "bills")
    world.update(be, n, {"paid": True})
    return {"status": "paid", "bill": bill["name"], "amount": bill["amount"], "new_balance": new}


@handler("play_song", "music", "media", "write", "Start playing a song by id.", {"song_id": _id_schema(ENTITY_BY_NAME["song"])},
         ["song_id"], errors=("NOT_FOUND",))
def play_song(world: World, a: dict[str, Any]) -> Any:
    e = ENTITY_BY_NAME["song"]
    song = world.get(e, parse_id(e, a["song_id"]))
    if song is None:
        raise _not_found(e, a["song_id"])
    world.set_device("now_playing", a["song_id"])
    world.set_device("playing", True)
    return {"playing": song["title"], "artist": song["artist"]}


@handler("pause_playback", "music", "media", "write", "Pause whatever is playing.", {}, [])
def pause_playback(world: World, a: dict[str, Any]) -> Any:
    world.set_device("playing", False)
    return {"playing": False}


@handler("get_now_playing", "music", "media", "read", "What is playing now.", {}, [])
def get_now_playing(world: World, a: dict[str, Any]) -> Any:
    if not world.device.get("playing"):
        return {"playing": False}
    e = ENTITY_BY_NAME["song"]
    song = world.get(e, parse_id(e, world.device["now_playing"]))
    return {"playing": True, "song_id": song["id"], "title": song["title"], "artist": song["artist"]}


@handler("set_media_volume", "music", "media", "write", "Set the media volume (0-100).", {"level": LEVEL}, ["level"])
def set_media_volume(world: World, a: dict[str, Any]) -> Any:
    world.set_device("media_volume", a["level"])
    return {"media_volume": a["level"]}


@handler("get_device_status", "settings", "device_settings", "read",
         "Battery, connectivity and other settings of the phone.", {}, [])
def get_device_status(world: World, a: dict[str, Any]) -> Any:
    return {k: v for k, v in sorted(world.device.items()) if k not in ("now_playing", "playing")}


def _toggle(key: str, label: str, pre: tuple[str, ...] = (), errors: tuple[str, ...] = ()) -> None:
    def run(world: World, a: dict[str, Any]) -> Any:
        if a["enabled"]:
            if key == "cellular" and world.device["airplane_mode"]:
                raise _pre_error("airplane")
            if key == "bluetooth" and world.device["low_power_mode"]:
                raise _pre_error("low_power")
        world.set_device(key, a["enabled"])
        return {key: a["enabled"]}

    _register(ToolSpec(name=f"set_{key}", app="settings", domain="device_settings", kind="write",
                       description=f"Turn {label} on or off.", parameters=_obj({"enabled": BOOL}, ["enabled"]),
                       errors=["INVALID_ARGUMENTS", *errors]), run)


def _level(key: str, label: str) -> None:
    def run(world: World, a: dict[str, Any]) -> Any:
        world.set_device(key, a["level"])
        return {key: a["level"]}

    _register(ToolSpec(name=f"set_{key}", app="settings", domain="device_settings", kind="write",
                       description=f"Set the {label} (0-100).", parameters=_obj({"level": LEVEL}, ["level"]),
                       errors=["INVALID_ARGUMENTS"]), run)


for _k, _l in (("airplane_mode", "airplane mode"), ("wifi", "Wi-Fi"), ("cellular", "cellular data"),
               ("bluetooth", "Bluetooth"), ("location_services", "location services"), ("do_not_disturb", "do not disturb"),
               ("low_power_mode", "low power mode"), ("dark_mode", "dark mode"), ("flashlight", "the flashlight")):
    _toggle(_k, _l, errors=("PRECONDITION_FAILED",) if _k in ("cellular", "bluetooth") else ())
_level("brightness", "screen brightness")
_level("ringer_volume", "ringer volume")

# -- utilities

UNITS: dict[str, tuple[str, float]] = {
    # unit -> (dimension, factor to the SI base); temperatures handled apart
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01), "mm": ("length", 0.001),
    "mi": ("length", 1609.344), "ft": ("length", 0.3048), "in": ("length", 0.0254), "yd": ("length", 0.9144),
    "meters": ("length", 1.0), "kilometers": ("length", 1000.0), "miles": ("length", 1609.344), "feet": ("length", 0.3048),
    "inches": ("length", 0.0254),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "lb": ("mass", 0.45359237), "oz": ("mass", 0.028349523125),
    "kilograms": ("mass", 1.0), "grams": ("mass", 0.001), "pounds": ("mass", 0.45359237), "ounces": ("mass", 0.028349523125),
    "l": ("volume", 1.0), "ml": ("volume", 0.001), "gal": ("volume", 3.785411784), "cup": ("volume", 0.2365882365),
    "liters": ("volume", 1.0), "gallons": ("volume", 3.785411784),
    "kmh": ("speed", 1 / 3.6), "mph": ("speed", 0.44704),
    "C": ("temperature", 0.0), "F": ("temperature", 0.0), "K": ("temperature", 0.0),
    "celsius": ("temperature", 0.0), "fahrenheit": ("temperature", 0.0),
}


def _to_celsius(v: float, u: str) -> float:
    u = {"celsius": "C", "fahrenheit": "F"}.get(u, u)
    return v if u == "C" else (v - 32) * 5 / 9 if u == "F" else v - 273.15


def _from_celsius(v: float, u: str) -> float:
    u = {"celsius": "C", "fahrenheit": "F"}.get(u, u)
    return v if u == "C" else v * 9 / 5 + 32 if u == "F" else v + 273.15


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Unit conversion used by convert_units (and by generators to compute expected answers)."""
    for u in (from_unit, to_unit):
        if u not in UNITS:
            raise ToolError(ErrorCode.UNSUPPORTED_VALUE, f"unit {u!r} is not supported",
                            hint="supported units: " + ", ".join(sorted(UNITS)))
    (da, fa), (db, fb) = UNITS[from_unit], UNITS[to_unit]
    if da != db:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, f"cannot convert {da} ({from_unit}) to {db} ({to_unit})")
    if da == "temperature":
        return round(_from_celsius(_to_celsius(value, from_unit), to_unit), 4)
    return round(value * fa / fb, 4)


@handler("convert_units", "converter", "utilities", "read", "Convert a value between units of length, mass, volume, speed or temperature.",
         {"value": {"type": "number"}, "from_unit": {"type": "string", "minLength": 1, "maxLength": 20},
          "to_unit": {"type": "string", "minLength": 1, "maxLength": 20}}, ["value", "from_unit", "to_unit"],
         errors=("UNSUPPORTED_VALUE",))
def convert_units(world: World, a: dict[str, Any]) -> Any:
    return {"value": convert(a["value"], a["from_unit"], a["to_unit"]), "unit": a["to_unit"]}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float:
    """Safe arithmetic: numbers, + - * / % ** and parentheses."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, "expression may only contain numbers, + - * / % ** and parentheses")

    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
        value = ev(tree)
    except ToolError:
        raise
    except ZeroDivisionError:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, "division by zero") from None
    except (SyntaxError, ValueError, OverflowError, RecursionError, TypeError):
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"cannot evaluate expression {expression!r}") from None
    if isinstance(value, complex) or value != value or abs(value) > 1e15:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "result out of range")
    return round(float(value), 6)


@handler("calculate", "calculator", "utilities", "read", "Evaluate an arithmetic expression (numbers, + - * / % ** and parentheses).",
         {"expression": {"type": "string", "minLength": 1, "maxLength": 200}}, ["expression"], errors=("UNSUPPORTED_VALUE",))
def calculate(world: World, a: dict[str, Any]) -> Any:
    return {"result": evaluate(a["expression"])}


RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.2, "CAD": 1.36, "AUD": 1.52, "CHF": 0.88, "MXN": 17.1,
         "INR": 83.2, "KRW": 1335.0}


def fx(amount: float, src: str, dst: str) -> float:
    return round(amount / RATES[src] * RATES[dst], 2)


@handler("convert_currency", "converter", "utilities", "read", "Convert an amount between currencies at today's rate.",
         {"amount": {"type": "number", "minimum": 0}, "from_currency": {"type": "string", "enum": list(RATES)},
          "to_currency": {"type": "string", "enum": list(RATES)}}, ["amount", "from_currency", "to_currency"],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def convert_currency(world: World, a: dict[str, Any]) -> Any:
    return {"amount": fx(a["amount"], a["from_currency"], a["to_currency"]), "currency": a["to_currency"],
            "rate": round(RATES[a["to_currency"]] / RATES[a["from_currency"]], 6)}


CONDITIONS = ("sunny", "cloudy", "rain", "light rain", "windy", "snow", "fog")


def weather(city: str, date: str) -> dict[str, Any]:
    h = stable_hash("weather", city, date)
    high = 4 + h % 26
    return {"city": city, "date": date, "condition": CONDITIONS[h % len(CONDITIONS)], "high_c": high,
            "low_c": high - 3 - (h >> 8) % 7, "precip_chance": (h >> 4) % 10 * 10}


CITY = {"type": "string", "minLength": 1, "maxLength": 60}


@handler("get_weather", "weather", "utilities", "read", "Weather forecast for a city, today or up to 6 days ahead.",
         {"city": CITY, "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "YYYY-MM-DD (default today)"}},
         ["city"], pre=NETWORK, errors=("NOT_FOUND", "UNSUPPORTED_VALUE", "PRECONDITION_FAILED"))
def get_weather(world: World, a: dict[str, Any]) -> Any:
    city = a["city"].strip().title()
    if city not in CITIES:
        raise ToolError(ErrorCode.NOT_FOUND, f"no forecast for {a['city']!r}", hint="cities: " + ", ".join(CITIES))
    today = _now(world).date()
    date = a.get("date", today.isoformat())
    try:
        d = dt.date.fromisoformat(date)
    except ValueError:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"bad date {date!r}") from None
    if not 0 <= (d - today).days <= 6:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "forecasts cover today and the next 6 days only")
    return weather(city, date)


PHRASES = {
    "good morning": {"spanish": "buenos días", "french": "bonjour", "german": "guten Morgen", "italian": "buongiorno", "japanese": "ohayō gozaimasu"},
    "thank you": {"spanish": "gracias", "french": "merci", "german": "danke", "italian": "grazie", "japanese": "arigatō"},
    "where is the station": {"spanish": "dónde está la estación", "french": "où est la gare", "german": "wo ist der Bahnhof",
                             "italian": "dov'è la stazione", "japanese": "eki wa doko desu ka"},
    "how much does it cost": {"spanish": "cuánto cuesta", "french": "combien ça coûte", "german": "wie viel kostet das",
                              "italian": "quanto costa", "japanese": "ikura desu ka"},
    "see you tomorrow": {"spanish": "hasta mañana", "french": "à demain", "german": "bis morgen", "italian": "a domani", "japanese": "mata ashita"},
    "happy birthday": {"spanish": "feliz cumpleaños", "french": "joyeux anniversaire", "german": "alles Gute zum Geburtstag",
                       "italian": "buon compleanno", "japanese": "tanjōbi omedetō"},
    "the bill please": {"spanish": "la cuenta por favor", "french": "l'addition s'il vous plaît", "german": "die Rechnung bitte",
                        "italian": "il conto per favore", "japanese": "okaikei onegaishimasu"},
}
LANGUAGES = ["spanish", "french", "german", "italian", "japanese"]


@handler("translate_text", "translate", "utilities", "read", "Translate a common phrase (offline phrasebook).",
         {"text": {"type": "string", "minLength": 1, "maxLength": 200}, "target_language": {"type": "string", "enum": LANGUAGES}},
         ["text", "target_language"], errors=("UNSUPPORTED_VALUE",))
def translate_text(world: World, a: dict[str, Any]) -> Any:
    key = a["text"].strip().lower().rstrip("?!.")
    if key not in PHRASES:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "phrase not in the offline phrasebook",
                        hint="phrasebook: " + "; ".join(PHRASES))
    return {"text": a["text"], "translation": PHRASES[key][a["target_language"]], "language": a["target_language"]}


UTC_OFFSET = {"Lisbon": 0, "Berlin": 1, "Tokyo": 9, "Toronto": -5, "Sydney": 11, "Nairobi": 3, "Chicago": -6,
              "Madrid": 1, "Seoul": 9, "Denver": -7, "Dublin": 0, "Oslo": 1, "Austin": -6, "Milan": 1, "Lima": -5, "Cairo": 2}


def city_time(now: str, home: str, city: str) -> str:
    t = dt.datetime.fromisoformat(now) + dt.timedelta(hours=UTC_OFFSET[city] - UTC_OFFSET[home])
    return t.strftime("%Y-%m-%d %H:%M")


@handler("get_time_in_city", "clock", "clock_alarms", "read", "Current local time in a city.", {"city": CITY}, ["city"],
         errors=("NOT_FOUND",))
def get_time_in_city(world: World, a: dict[str, Any]) -> Any:
    city = a["city"].strip().title()
    if city not in UTC_OFFSET:
        raise ToolError(ErrorCode.NOT_FOUND, f"unknown city {a['city']!r}", hint="cities: " + ", ".join(UTC_OFFSET))
    return {"city": city, "local_time": city_time(world.device["now"], world.persona.home_city, city)}


@handler("web_search", "browser", "utilities", "read", "Search the web (cached results).",
         {"query": {"type": "string", "minLength": 1, "maxLength": 200}}, ["query"], pre=NETWORK, errors=("PRECONDITION_FAILED",))
def web_search(world: World, a: dict[str, Any]) -> Any:
    h = stable_hash("web", a["query"].lower())
    return {"results": [{"title": f"{a['query']} - result {i + 1}", "url": f"https://example.com/{(h >> i) % 9973}"} for i in range(3)]}


# ------------------------------------------------------------------------------------------- preconditions

_FIXES = {
    "airplane": ("airplane mode is on", "set_airplane_mode", {"enabled": False}),
    "no_network": ("no network: Wi-Fi and cellular are off", "set_wifi", {"enabled": True}),
    "cellular": ("cellular is off", "set_cellular", {"enabled": True}),
    "location": ("location services are off", "set_location_services", {"enabled": True}),
    "low_power": ("low power mode blocks turning on Bluetooth", "set_low_power_mode", {"enabled": False}),
}


def _pre_error(kind: str) -> ToolError:
    msg, tool, args = _FIXES[kind]
    return ToolError(ErrorCode.PRECONDITION_FAILED, msg, hint=f"call {tool} with {args} first, then retry",
                     result={"fix": {"name": tool, "arguments": args}})


def check_preconditions(world: World, pre: tuple[str, ...]) -> None:
    """Raise the PRECONDITION_FAILED ToolError of the first unmet precondition (device state only)."""
    d = world.device
    for p in pre:
        if p == "network":
            if d["airplane_mode"]:
                raise _pre_error("airplane")
            if not (d["wifi"] or d["cellular"]):
                raise _pre_error("no_network")
        elif p == "cellular":
            if d["airplane_mode"]:
                raise _pre_error("airplane")
            if not d["cellular"]:
                raise _pre_error("cellular")
        elif p == "location":
            if not d["location_services"]:
                raise _pre_error("location")


DELEGATE_SPEC = ToolSpec(
    name="delegate", app="harness", domain="utilities", kind="read",
    description="Hand a sub-task to a sub-agent role; its tool calls follow until you delegate again or answer the user.",
    parameters=_obj({"agent": {"type": "string", "minLength": 1, "maxLength": 40, "description": "sub-agent role"},
                     "instruction": {"type": "string", "minLength": 1, "maxLength": 1000}}, ["agent", "instruction"]),
)
