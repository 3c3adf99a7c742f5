"""Media scenarios: playing a song and setting the media volume."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.taskgen.common import describe, done, search_step, tc
from mpa_jax.envs.taskgen.registry import Ctx, template


@template("music.play", "media", "tool_use", 1, weight=2)
def play(ctx: Ctx) -> dict[str, Any]:
    e = ENTITY_BY_NAME["song"]
    s = ctx.choice([r for r in ctx.rows(e) if describe(ctx, e, r)])
    return {"instruction": f'Play "{s["title"]}" by {s["artist"]}.',
            "gold": [search_step(ctx, e, s["title"]), tc("play_song", {"song_id": s["id"]}), done(ctx, f"playing {s['title']}")],
            "verifier": {"goals": [{"kind": "device", "key": "now_playing", "value": s["id"]},
                                   {"kind": "device", "key": "playing", "value": True}]}}


@template("music.volume", "media", "tool_use", 1)
def volume(ctx: Ctx) -> dict[str, Any]:
    lvl = ctx.choice([10, 20, 35, 60, 80])
    return {"initial_state": {"device": {"media_volume": 50}}, "instruction": f"Set the media volume to {lvl}%.",
            "gold": [tc("set_media_volume", {"level": lvl}), done(ctx, f"media volume is {lvl}%")],
            "verifier": {"goals": [{"kind": "device", "key": "media_volume", "value": lvl}]}}
