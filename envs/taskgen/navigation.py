"""Navigation and rides scenarios: route times between saved places, booking and cancelling rides."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME, POOLS
from mpa_jax.envs.taskgen.common import done, msg, saved_pair, search_step, tc
from mpa_jax.envs.taskgen.registry import Ctx, template
from mpa_jax.envs.tools import MODES, route_km


@template("route.between_saved", "navigation_rides", "tool_use", 2, weight=2)
def route_saved(ctx: Ctx) -> dict[str, Any]:
    a, b = saved_pair(ctx)
    mode = ctx.choice(sorted(MODES))
    km = route_km(a["address"], b["address"])
    mins = max(1, round(km / MODES[mode] * 60))
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'How long does it take from my saved place "{a["name"]}" to "{b["name"]}" by {mode}?',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     tc("get_route", {"origin": a["address"], "destination": b["address"], "mode": mode}),
                     msg(f"About {mins} minutes by {mode} ({km} km).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [mins]}}}


@template("rides.book_to_saved", "navigation_rides", "tool_use", 2, weight=2)
def ride_book(ctx: Ctx) -> dict[str, Any]:
    a, b = saved_pair(ctx)
    kind = ctx.choice(["standard", "comfort", "xl"])
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'Book a {kind} ride from "{a["name"]}" to "{b["name"]}".',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     tc("book_ride", {"pickup": a["address"], "dropoff": b["address"], "ride_type": kind}), done(ctx, "your ride is booked")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "ride", "name": "ride_booked",
                                    "match": {"pickup": a["address"], "dropoff": b["address"], "ride_type": kind, "status": "booked"}}]}}


@template("rides.cancel", "navigation_rides", "tool_use", 2)
def ride_cancel(ctx: Ctx) -> dict[str, Any] | None:
    e = ENTITY_BY_NAME["ride"]
    ride = {"pickup": ctx.choice(POOLS["address"]), "dropoff": ctx.choice(POOLS["poi"]), "ride_type": "standard", "status": "booked", "fare": 18.5}
    rid = f"ride_{e.n + 1}"
    return {"initial_state": {"rows": {"ride": [ride]}},
            "instruction": f"Cancel my booked ride to {ride['dropoff']}.",
            "gold": [search_step(ctx, e, ride["dropoff"]), tc("cancel_ride", {"id": rid}), done(ctx, "the ride is cancelled")],
            "verifier": {"goals": [{"kind": "field", "entity": "ride", "id": rid, "values": {"status": "cancelled"}}]}}
