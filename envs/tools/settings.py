"""The settings app: device status, on/off toggles and 0-100 levels.

Turning cellular on in airplane mode, or Bluetooth on in low power mode, fails with the fix named
(preconditions.py).
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.contract import ToolSpec
from mpa_jax.envs.tools.base import BOOL, LEVEL, handler, object_schema, register
from mpa_jax.envs.tools.preconditions import precondition_error
from mpa_jax.envs.world import World


@handler("get_device_status", "settings", "device_settings", "read",
         "Battery, connectivity and other settings of the phone.", {}, [])
def get_device_status(world: World, a: dict[str, Any]) -> Any:
    return {k: v for k, v in sorted(world.device.items()) if k not in ("now_playing", "playing")}


def _toggle(key: str, label: str, pre: tuple[str, ...] = (), errors: tuple[str, ...] = ()) -> None:
    def run(world: World, a: dict[str, Any]) -> Any:
        if a["enabled"]:
            if key == "cellular" and world.device["airplane_mode"]:
                raise precondition_error("airplane")
            if key == "bluetooth" and world.device["low_power_mode"]:
                raise precondition_error("low_power")
        world.set_device(key, a["enabled"])
        return {key: a["enabled"]}

    register(ToolSpec(name=f"set_{key}", app="settings", domain="device_settings", kind="write",
                       description=f"Turn {label} on or off.", parameters=object_schema({"enabled": BOOL}, ["enabled"]),
                       errors=["INVALID_ARGUMENTS", *errors]), run)


def _level(key: str, label: str) -> None:
    def run(world: World, a: dict[str, Any]) -> Any:
        world.set_device(key, a["level"])
        return {key: a["level"]}

    register(ToolSpec(name=f"set_{key}", app="settings", domain="device_settings", kind="write",
                       description=f"Set the {label} (0-100).", parameters=object_schema({"level": LEVEL}, ["level"]),
                       errors=["INVALID_ARGUMENTS"]), run)


for _k, _l in (("airplane_mode", "airplane mode"), ("wifi", "Wi-Fi"), ("cellular", "cellular data"),
               ("bluetooth", "Bluetooth"), ("location_services", "location services"), ("do_not_disturb", "do not disturb"),
               ("low_power_mode", "low power mode"), ("dark_mode", "dark mode"), ("flashlight", "the flashlight")):
    _toggle(_k, _l, errors=("PRECONDITION_FAILED",) if _k in ("cellular", "bluetooth") else ())
_level("brightness", "screen brightness")
_level("ringer_volume", "ringer volume")
