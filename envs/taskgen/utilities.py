"""Scenarios over the utility apps: unit conversion (the seed scenario included), calculator, currency,
weather, translation and the world clock.

Grouped by the apps they drive; a scenario's own domain label can differ (`convert.text_coach` counts
under health_fitness, `weather.offline` under device_settings, `clock.time_in_city` under clock_alarms).
Expected answers come from the tools' own functions (`convert`, `fx`, `weather`, `city_time`).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME, POOLS
from mpa_jax.envs.taskgen.common import fmt, msg, search_step, sms_goal, tc, with_history
from mpa_jax.envs.taskgen.registry import Ctx, template
from mpa_jax.envs.tools import LANGUAGES, PHRASES, RATES, city_time, convert, fx, weather


COACH_FACTOR = 2.20462


def _seed_like(ctx: Ctx, kg: float) -> dict[str, Any]:
    coach = ctx.row("contact", ctx.persona.roles["coach"])
    lb = round(kg * COACH_FACTOR, 2)
    body = f"{fmt(kg)} kg is {lb:.2f} lb."
    expr = f"{fmt(kg)} * {COACH_FACTOR}"
    history = with_history(ctx, [
        {"role": "user", "content": f"I've started training with {coach['name']}. They're my coach now and want weekly weigh-ins."},
        {"role": "assistant", "content": f"Great, I'll remember that {coach['name']} is your coach."}])
    calc = tc("calculate", {"expression": expr}, why=f"The converter doesn't take kilograms, so I'll compute it: 1 kg = {COACH_FACTOR} lb.")
    kg_try2 = tc("convert_units", {"value": kg, "from_unit": "kilograms", "to_unit": "pounds"},
                  why="It rejected 'kg'; maybe it wants full unit names.", fallbacks=[calc])
    return {
        "history": history,
        "gold": [
            tc("convert_units", {"value": kg, "from_unit": "kg", "to_unit": "lb"}, fallbacks=[kg_try2, calc]),
            search_step(ctx, ENTITY_BY_NAME["contact"], coach["name"]),
            tc("send_sms", {"to": coach["id"], "body": body}),
            msg(f"{fmt(kg)} kg is {lb:.2f} lb; I texted that to your coach {coach['name']}."),
        ],
        "faults": [{"tool": "convert_units", "code": "UNSUPPORTED_VALUE", "when": {"from_unit": ["kg", "kilograms"]},
                    "message": "mass unit not supported by this converter",
                    "hint": "kilogram conversions are unavailable; use calculate with 1 kg = 2.20462 lb"}],
        "verifier": {"goals": [sms_goal(coach, f"{lb:.2f}")], "answer": {"kind": "answer", "contains": [lb]},
                     "milestones": [{"tool": "calculate"}, {"tool": "send_sms", "args": {"to": coach["id"]}}]},
        "metadata": {"seed_scenario": True},
    }


@template("seed.coach_70kg", "utilities", "memory", 3, weight=1.0)
def seed_coach(ctx: Ctx) -> dict[str, Any]:
    out = _seed_like(ctx, 70)
    out["instruction"] = "Convert 70 kg to pounds and text it to my coach."
    return out


@template("convert.text_coach", "health_fitness", "memory", 3)
def convert_text_coach(ctx: Ctx) -> dict[str, Any]:
    kg = ctx.choice([58, 61.5, 64, 72, 75.5, 80, 83, 88, 91.2])
    out = _seed_like(ctx, kg)
    out["instruction"] = ctx.choice([f"Convert {fmt(kg)} kg to pounds and send it to my coach.",
                                     f"I weigh {fmt(kg)} kg today. Text my coach the weight in pounds."])
    return out


@template("convert.units", "utilities", "tool_use", 1, weight=3)
def convert_units_t(ctx: Ctx) -> dict[str, Any]:
    pairs = [("km", "mi"), ("mi", "km"), ("lb", "kg"), ("g", "oz"), ("C", "F"), ("F", "C"), ("l", "gal"), ("ft", "m"),
             ("cm", "in"), ("mph", "kmh"), ("oz", "g"), ("m", "ft")]
    a, b = ctx.choice(pairs)
    v = ctx.choice([3, 5, 10, 12.5, 21, 26.2, 37, 42, 100, 180, 250])
    r = convert(v, a, b)
    return {"instruction": ctx.choice([f"Convert {fmt(v)} {a} to {b}.", f"How much is {fmt(v)} {a} in {b}?"]),
            "gold": [tc("convert_units", {"value": v, "from_unit": a, "to_unit": b}), msg(f"{fmt(v)} {a} is {r:g} {b}.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [round(r, 2)]}}}


@template("convert.fallback_calc", "utilities", "tool_use", 3, weight=2)
def convert_fallback(ctx: Ctx) -> dict[str, Any]:
    a, b, long_a, long_b, factor = ctx.choice([("mi", "km", "miles", "kilometers", 1.609344), ("lb", "kg", "pounds", "kilograms", 0.45359237),
                                                ("ft", "m", "feet", "meters", 0.3048), ("gal", "l", "gallons", "liters", 3.785411784)])
    v = ctx.choice([4, 6, 15, 26.2, 40, 150])
    r = round(v * factor, 2)
    calc = tc("calculate", {"expression": f"{fmt(v)} * {factor}"}, why=f"The converter won't take {a}; 1 {a} = {factor} {b}, so I'll calculate.")
    return {"instruction": f"How many {long_b} is {fmt(v)} {long_a}?",
            "gold": [tc("convert_units", {"value": v, "from_unit": a, "to_unit": b},
                         fallbacks=[tc("convert_units", {"value": v, "from_unit": long_a, "to_unit": long_b}), calc]),
                     msg(f"{fmt(v)} {long_a} is about {r:.2f} {long_b}.")],
            "faults": [{"tool": "convert_units", "code": "UNSUPPORTED_VALUE", "when": {"from_unit": [a, long_a]},
                        "message": f"unit {a} is temporarily unsupported", "hint": "use calculate with the standard factor"}],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("calc.tip_split", "utilities", "tool_use", 1, weight=2)
def tip_split(ctx: Ctx) -> dict[str, Any]:
    bill = ctx.choice([48.6, 72.0, 86.4, 120.0, 135.5, 64.2])
    tip = ctx.choice([10, 15, 18, 20])
    n = ctx.choice([2, 3, 4])
    expr = f"{fmt(bill)} * (1 + {tip} / 100) / {n}"
    r = round(bill * (1 + tip / 100) / n, 2)
    return {"instruction": f"Our bill is {fmt(bill)} dollars. With a {tip}% tip, split {n} ways, how much does each person pay?",
            "gold": [tc("calculate", {"expression": expr}), msg(f"Each person pays {r:.2f} dollars.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("fx.convert", "utilities", "tool_use", 1, weight=2)
def fx_convert(ctx: Ctx) -> dict[str, Any]:
    a, b = ctx.rng.sample(sorted(RATES), 2)
    amt = ctx.choice([20, 50, 75, 120, 300, 1000])
    r = fx(amt, a, b)
    return {"instruction": f"How much is {amt} {a} in {b}?",
            "gold": [tc("convert_currency", {"amount": amt, "from_currency": a, "to_currency": b}), msg(f"{amt} {a} is {r:.2f} {b}.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("weather.forecast", "utilities", "tool_use", 1, weight=2)
def weather_t(ctx: Ctx) -> dict[str, Any]:
    city = ctx.choice(sorted(set(POOLS["tz_city"])))
    days = ctx.choice([0, 1, 2, 3])
    date = (ctx.today + dt.timedelta(days=days)).isoformat()
    w = weather(city, date)
    when = {0: "today", 1: "tomorrow"}.get(days, f"on {date}")
    return {"instruction": f"What's the high temperature in {city} {when}?",
            "gold": [tc("get_weather", {"city": city, "date": date}), msg(f"The high in {city} {when} is {w['high_c']} C ({w['condition']}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [w["high_c"]]}}}


@template("weather.offline", "device_settings", "tool_use", 3)
def weather_offline(ctx: Ctx) -> dict[str, Any]:
    out = weather_t(ctx)
    out["initial_state"] = {"device": {"airplane_mode": True}}
    out["verifier"]["allow"] = ["device.airplane_mode"]
    out["extra_tools"] = ["set_airplane_mode"]
    return out


@template("translate.phrase", "utilities", "tool_use", 1)
def translate_t(ctx: Ctx) -> dict[str, Any]:
    phrase = ctx.choice(sorted(PHRASES))
    lang = ctx.choice(LANGUAGES)
    tr = PHRASES[phrase][lang]
    return {"instruction": f'How do I say "{phrase}" in {lang.capitalize()}?',
            "gold": [tc("translate_text", {"text": phrase, "target_language": lang}), msg(f'In {lang.capitalize()}: "{tr}".')],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [tr]}}}


@template("clock.time_in_city", "clock_alarms", "tool_use", 1, weight=2)
def time_in_city(ctx: Ctx) -> dict[str, Any]:
    city = ctx.choice([c for c in sorted(set(POOLS["tz_city"])) if c != ctx.persona.home_city])
    t = city_time(ctx.persona.now, ctx.persona.home_city, city)
    return {"instruction": f"What time is it in {city} right now?",
            "gold": [tc("get_time_in_city", {"city": city}), msg(f"It's {t[11:]} in {city} ({t[:10]}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [t[11:]]}}}
