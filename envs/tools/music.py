"""The music app: play, pause, now playing and media volume (playback lives in the device state)."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.tools.base import LEVEL, handler, id_schema, not_found
from mpa_jax.envs.world import World, parse_id


@handler("play_song", "music", "media", "write", "Start playing a song by id.", {"song_id": id_schema(ENTITY_BY_NAME["song"])},
         ["song_id"], errors=("NOT_FOUND",))
def play_song(world: World, a: dict[str, Any]) -> Any:
    e = ENTITY_BY_NAME["song"]
    song = world.get(e, parse_id(e, a["song_id"]))
    if song is None:
        raise not_found(e, a["song_id"])
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
