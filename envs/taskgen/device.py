"""Device settings scenarios: toggles, levels, battery, and Bluetooth blocked by low power mode."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.taskgen.common import done, msg, tc
from mpa_jax.envs.taskgen.registry import Ctx, template


@template("device.toggle", "device_settings", "tool_use", 1, weight=3)
def toggle(ctx: Ctx) -> dict[str, Any]:
    key, label = ctx.choice([("wifi", "Wi-Fi"), ("bluetooth", "Bluetooth"), ("do_not_disturb", "do not disturb"),
                             ("dark_mode", "dark mode"), ("location_services", "location services"), ("flashlight", "the flashlight")])
    on = ctx.choice([True, False])
    state = {"device": {key: not on}}
    return {"initial_state": state, "instruction": f"Turn {'on' if on else 'off'} {label}.",
            "gold": [tc(f"set_{key}", {"enabled": on}), done(ctx, f"{label} is {'on' if on else 'off'}")],
            "verifier": {"goals": [{"kind": "device", "key": key, "value": on}]}}


@template("device.bluetooth_low_power", "device_settings", "tool_use", 3)
def bt_low_power(ctx: Ctx) -> dict[str, Any]:
    return {"initial_state": {"device": {"bluetooth": False, "low_power_mode": True}},
            "instruction": "Turn on Bluetooth.",
            "gold": [tc("set_bluetooth", {"enabled": True}), done(ctx, "Bluetooth is on (I had to turn off low power mode)")],
            "verifier": {"goals": [{"kind": "device", "key": "bluetooth", "value": True}], "allow": ["device.low_power_mode"]},
            "extra_tools": ["set_low_power_mode"]}


@template("device.level", "device_settings", "tool_use", 1)
def level(ctx: Ctx) -> dict[str, Any]:
    key, label = ctx.choice([("brightness", "screen brightness"), ("ringer_volume", "ringer volume")])
    lvl = ctx.choice([15, 30, 45, 75, 90])
    return {"initial_state": {"device": {key: 50}}, "instruction": f"Set the {label} to {lvl}%.",
            "gold": [tc(f"set_{key}", {"level": lvl}), done(ctx, f"{label} set to {lvl}%")],
            "verifier": {"goals": [{"kind": "device", "key": key, "value": lvl}]}}


@template("device.battery", "device_settings", "tool_use", 1)
def battery(ctx: Ctx) -> dict[str, Any]:
    b = ctx.choice([12, 23, 47, 64, 91])
    return {"initial_state": {"device": {"battery": b}}, "instruction": "How much battery do I have left?",
            "gold": [tc("get_device_status", {}), msg(f"Your battery is at {b}%.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [b]}}}
