"""Navigation apps: maps (routes, current location) and rides (book, cancel).

`route_km` is a deterministic stand-in for a routing service; task generators use it for expected answers.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import NETWORK, STR, ToolError, handler, id_schema, not_found
from mpa_jax.envs.world import World, parse_id, stable_hash


MODES = {"driving": 45.0, "transit": 28.0, "cycling": 16.0, "walking": 5.0}


def route_km(origin: str, destination: str) -> float:
    """Deterministic distance between two places (order-free): 1.0 to 40.9 km."""
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
         {"id": id_schema(ENTITY_BY_NAME["ride"])}, ["id"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED"))
def cancel_ride(world: World, a: dict[str, Any]) -> Any:
    e = ENTITY_BY_NAME["ride"]
    n = parse_id(e, a["id"])
    row = world.get(e, n)
    if row is None:
        raise not_found(e, a["id"])
    if row["status"] != "booked":
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"ride {a['id']} is {row['status']}; only booked rides can be cancelled")
    world.update(e, n, {"status": "cancelled"})
    return {"id": a["id"], "status": "cancelled"}
