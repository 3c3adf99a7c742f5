"""Communication scenarios: texting, calling and emailing contacts, with a device that needs fixing
first, an ambiguous name to ask about, and a recipient named by role earlier in the chat (memory).
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME, POOLS
from mpa_jax.envs.taskgen.common import done, msg, pick_contact, search_step, tc, with_history
from mpa_jax.envs.taskgen.registry import Ctx, template


@template("sms.contact", "communication", "tool_use", 1, weight=2)
def sms_contact(ctx: Ctx) -> dict[str, Any]:
    c, _ = pick_contact(ctx)
    body = ctx.choice(POOLS["reply"])
    return {"instruction": f'Text {c["name"]}: "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), tc("send_sms", {"to": c["id"], "body": body}),
                     done(ctx, f"I texted {c['name']}")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "sms", "name": "text_sent",
                                    "match": {"to_number": c["phone"], "body": body, "direction": "out"}}]}}


@template("sms.cellular_off", "communication", "tool_use", 3)
def sms_cellular_off(ctx: Ctx) -> dict[str, Any]:
    out = sms_contact(ctx)
    key = ctx.choice(["cellular", "airplane_mode"])
    out["initial_state"] = {"device": {key: key == "airplane_mode"}}
    out["verifier"]["allow"] = [f"device.{key}"]
    out["extra_tools"] = [f"set_{key}"]
    return out


@template("sms.ambiguous_name", "communication", "tool_use", 3, weight=2)
def sms_ambiguous(ctx: Ctx) -> dict[str, Any]:
    a, b = (ctx.row("contact", i) for i in ctx.persona.twins)
    first = a["name"].split()[0]
    body = ctx.choice(POOLS["reply"])
    return {"instruction": f'Text {first}: "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], first),
                     msg(f"I found two contacts named {first}: {a['name']} and {b['name']}. Which one should I text?",
                         why=f"Two contacts match {first}; texting the wrong one would be worse than asking.")],
            "verifier": {"goals": [], "answer": {"kind": "ask", "contains": [a["name"].split()[1], b["name"].split()[1]]},
                         "minefields": [{"kind": "call", "tool": "send_sms", "name": "guessed_recipient"}]},
            "extra_tools": ["send_sms"]}


@template("call.contact", "communication", "tool_use", 1)
def call_contact(ctx: Ctx) -> dict[str, Any]:
    c, _ = pick_contact(ctx)
    return {"instruction": ctx.choice([f"Call {c['name']}.", f"Please ring {c['name']} for me."]),
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), tc("make_call", {"to": c["id"]}), done(ctx, f"calling {c['name']}")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "call", "name": "call_started",
                                    "match": {"number": c["phone"], "direction": "out"}}]}}


@template("email.contact", "communication", "tool_use", 2)
def email_contact(ctx: Ctx) -> dict[str, Any]:
    c, _ = pick_contact(ctx)
    subject, body = ctx.choice(POOLS["subject"]), ctx.choice(POOLS["body"])
    return {"instruction": f'Email {c["name"]} with the subject "{subject}" and the text "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), tc("get_contact", {"id": c["id"]}),
                     tc("send_email", {"to": c["email"], "subject": subject, "body": body}), done(ctx, f"the email to {c['name']} is sent")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "email", "name": "email_sent",
                                    "match": {"recipient": c["email"], "subject": subject, "folder": "sent"}}]}}


@template("memory.text_role", "communication", "memory", 2, weight=3)
def text_role(ctx: Ctx) -> dict[str, Any]:
    role = ctx.choice(sorted(ctx.persona.roles))
    c = ctx.row("contact", ctx.persona.roles[role])
    other_role = ctx.choice([r for r in sorted(ctx.persona.roles) if r != role])
    o = ctx.row("contact", ctx.persona.roles[other_role])
    body = ctx.choice(POOLS["reply"])
    return {"history": with_history(ctx, [
                {"role": "user", "content": f"{c['name']} is my {role}, by the way."},
                {"role": "assistant", "content": "Thanks, noted."},
                {"role": "user", "content": f"And {o['name']} is my {other_role}."},
                {"role": "assistant", "content": "Got it."}]),
            "instruction": f'Text my {role}: "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), tc("send_sms", {"to": c["id"], "body": body}),
                     done(ctx, f"I texted your {role} {c['name']}")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "sms", "name": "text_sent",
                                    "match": {"to_number": c["phone"], "body": body, "direction": "out"}}]}}
