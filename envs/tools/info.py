"""Read-only information apps: weather, translate (offline phrasebook), clock (time in a city) and browser.

The answers are deterministic functions of their inputs (`weather`, `city_time`, PHRASES), so task
generators compute expected answers with the same code.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from mpa_jax.envs.catalog import CITIES
from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import CITY, NETWORK, ToolError, device_now, handler
from mpa_jax.envs.world import World, stable_hash


CONDITIONS = ("sunny", "cloudy", "rain", "light rain", "windy", "snow", "fog")


def weather(city: str, date: str) -> dict[str, Any]:
    """The deterministic forecast of `city` on `date` (a hash of both)."""
    h = stable_hash("weather", city, date)
    high = 4 + h % 26
    return {"city": city, "date": date, "condition": CONDITIONS[h % len(CONDITIONS)], "high_c": high,
            "low_c": high - 3 - (h >> 8) % 7, "precip_chance": (h >> 4) % 10 * 10}


@handler("get_weather", "weather", "utilities", "read", "Weather forecast for a city, today or up to 6 days ahead.",
         {"city": CITY, "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "YYYY-MM-DD (default today)"}},
         ["city"], pre=NETWORK, errors=("NOT_FOUND", "UNSUPPORTED_VALUE", "PRECONDITION_FAILED"))
def get_weather(world: World, a: dict[str, Any]) -> Any:
    city = a["city"].strip().title()
    if city not in CITIES:
        raise ToolError(ErrorCode.NOT_FOUND, f"no forecast for {a['city']!r}", hint="cities: " + ", ".join(CITIES))
    today = device_now(world).date()
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
    """Local time in `city` when it is `now` in `home` ("YYYY-MM-DD HH:MM")."""
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
