"""Device-state preconditions of tools (network, cellular, location) and the fix each failure names.

The sandbox pipeline checks a tool's declared preconditions before its executor runs (sandbox.py); a
failure is PRECONDITION_FAILED with a hint and a machine-readable `fix` (the call that clears it).
"""
from __future__ import annotations

from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import ToolError
from mpa_jax.envs.world import World


_FIXES = {
    "airplane": ("airplane mode is on", "set_airplane_mode", {"enabled": False}),
    "no_network": ("no network: Wi-Fi and cellular are off", "set_wifi", {"enabled": True}),
    "cellular": ("cellular is off", "set_cellular", {"enabled": True}),
    "location": ("location services are off", "set_location_services", {"enabled": True}),
    "low_power": ("low power mode blocks turning on Bluetooth", "set_low_power_mode", {"enabled": False}),
}


def precondition_error(kind: str) -> ToolError:
    """The PRECONDITION_FAILED error of `kind`, with its fix as a hint and as `result["fix"]`."""
    msg, tool, args = _FIXES[kind]
    return ToolError(ErrorCode.PRECONDITION_FAILED, msg, hint=f"call {tool} with {args} first, then retry",
                     result={"fix": {"name": tool, "arguments": args}})


def check_preconditions(world: World, pre: tuple[str, ...]) -> None:
    """Raise the PRECONDITION_FAILED ToolError of the first unmet precondition (device state only)."""
    d = world.device
    for p in pre:
        if p == "network":
            if d["airplane_mode"]:
                raise precondition_error("airplane")
            if not (d["wifi"] or d["cellular"]):
                raise precondition_error("no_network")
        elif p == "cellular":
            if d["airplane_mode"]:
                raise precondition_error("airplane")
            if not d["cellular"]:
                raise precondition_error("cellular")
        elif p == "location":
            if not d["location_services"]:
                raise precondition_error("location")
