"""Scenarios composed from other domains' pieces, registered last: the commute-brief skill (maps and
weather in parallel) and a bank transfer carried out by a sub-agent role.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.taskgen.common import delegate, msg, saved_pair, search_step, tc
from mpa_jax.envs.taskgen.payments import transfer
from mpa_jax.envs.taskgen.registry import Ctx, template
from mpa_jax.envs.tools import MODES, route_km, weather


@template("skills.commute_brief", "navigation_rides", "skills", 2, family="commute_brief")
def commute_brief(ctx: Ctx) -> dict[str, Any]:
    a, b = saved_pair(ctx)
    w = weather(ctx.persona.home_city, ctx.today.isoformat())
    km = route_km(a["address"], b["address"])
    mins = max(1, round(km / MODES["transit"] * 60))
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'Give me a commute brief: transit time from "{a["name"]}" to "{b["name"]}" and today\'s high in {ctx.persona.home_city}.',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     tc("get_weather", {"city": ctx.persona.home_city}, group=2),
                     tc("get_route", {"origin": a["address"], "destination": b["address"], "mode": "transit"}, group=2),
                     msg(f"Transit takes about {mins} minutes; today's high is {w['high_c']} C ({w['condition']}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [mins, w["high_c"]]},
                         "milestones": [{"tool": "get_weather"}, {"tool": "get_route"}]}}


@template("sub.transfer_via_roles", "payments_banking", "subagent", 3)
def sub_transfer(ctx: Ctx) -> dict[str, Any] | None:
    out = transfer(ctx)
    if out is None:
        return None
    g = out["gold"]
    out["roles"] = {"planner": [], "banker": ["search_payees", "search_accounts", "transfer_money"]}
    out["gold"] = [delegate("banker", "Find the payee and account, then make the transfer."),
                   *[{k: v for k, v in dict(s, agent="banker").items() if k != "group"} for s in g[:3]], g[3]]
    out["verifier"]["milestones"] = [{"tool": "transfer_money", "agent": "banker"}]
    return out
