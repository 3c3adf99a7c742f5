"""Communication apps: messages (send_sms), phone (make_call) and email (send_email).

A recipient is a contact id or a phone number; blocked numbers are refused with PERMISSION_DENIED.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import NETWORK, ToolError, handler, not_found
from mpa_jax.envs.world import World, parse_id


def _resolve_contact(world: World, to: str) -> tuple[str, str]:
    """`to` is a contact id or a phone number; returns (name, number)."""
    e = ENTITY_BY_NAME["contact"]
    if to.startswith("contact_"):
        n = parse_id(e, to)
        row = world.get(e, n) if n is not None else None
        if row is None:
            raise not_found(e, to)
        return row["name"], row["phone"]
    digits = to.replace("-", "").replace(" ", "")
    if not (digits.startswith("+") and digits[1:].isdigit() or digits.isdigit()) or len(digits) < 7:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"'to' must be a contact id or a phone number, got {to!r}",
                        hint="search_contacts returns contact ids")
    hit = world.conn.execute("SELECT name FROM contacts_contacts WHERE phone = ?", (to,)).fetchone()
    return (hit[0] if hit else ""), to


def _check_blocked(world: World, number: str) -> None:
    if world.conn.execute("SELECT 1 FROM contacts_blocked_numbers WHERE number = ?", (number,)).fetchone():
        raise ToolError(ErrorCode.PERMISSION_DENIED, f"{number} is on the blocked list",
                        hint="unblock it with delete_blocked_number first if the user wants to")


TO = {"type": "string", "minLength": 1, "maxLength": 40, "description": "contact id (contact_N) or phone number"}


@handler("send_sms", "messages", "communication", "write", "Send a text message to a contact id or a phone number.",
         {"to": TO, "body": {"type": "string", "minLength": 1, "maxLength": 1000}}, ["to", "body"],
         pre=("cellular",), errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def send_sms(world: World, a: dict[str, Any]) -> Any:
    name, number = _resolve_contact(world, a["to"])
    _check_blocked(world, number)
    rid = world.insert(ENTITY_BY_NAME["sms"], {"contact_name": name, "to_number": number, "body": a["body"],
                                               "direction": "out", "sent_at": world.device["now"]})
    return {"id": rid, "status": "sent", "to": number}


@handler("make_call", "phone", "communication", "write", "Start a phone call to a contact id or a phone number.",
         {"to": TO}, ["to"], pre=("cellular",), errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def make_call(world: World, a: dict[str, Any]) -> Any:
    name, number = _resolve_contact(world, a["to"])
    _check_blocked(world, number)
    rid = world.insert(ENTITY_BY_NAME["call"], {"contact_name": name, "number": number, "direction": "out",
                                                "duration_s": 0, "at": world.device["now"]})
    return {"id": rid, "status": "calling", "to": number}


EMAIL = {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]+$", "description": "email address"}


@handler("send_email", "email", "communication", "write", "Send an email.",
         {"to": EMAIL, "subject": {"type": "string", "minLength": 1, "maxLength": 200}, "body": {"type": "string", "maxLength": 5000}},
         ["to", "subject", "body"], pre=NETWORK, errors=("PRECONDITION_FAILED",))
def send_email(world: World, a: dict[str, Any]) -> Any:
    rid = world.insert(ENTITY_BY_NAME["email"], {"sender": "me@phone.example", "recipient": a["to"], "subject": a["subject"],
                                                 "body": a["body"], "folder": "sent", "received_at": world.device["now"]})
    return {"id": rid, "status": "sent"}
