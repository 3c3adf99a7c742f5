"""What templates of every domain share: phrasing, gold-step builders, chit-chat history, common picks.

Gold steps are the dicts the oracle replays (oracle.py): `tc` (a tool call, checked against TOOLS),
`search_step`, `msg`, `delegate`. `with_history` hides key turns among chit-chat for memory tasks.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME, Entity, Field
from mpa_jax.envs.taskgen.registry import Ctx
from mpa_jax.envs.tools import TOOLS


def fmt(v: Any) -> str:
    """How a value reads in a sentence: yes/no for booleans, floats without trailing zeros."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def say(f: Field, v: Any) -> str:
    """A field and its value as the user would say it (`title "Gym"`, `alarm on`)."""
    if f.type == "bool":
        return f"{f.words} {'on' if v else 'off'}"
    if f.type in ("str",) and not f.ref:
        return f'{f.words} "{v}"'
    return f"{f.words} {fmt(v)}"


def join(parts: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def describe(ctx: Ctx, e: Entity, row: dict[str, Any]) -> str | None:
    """How the user names a row: its title, plus a distinguishing field when the title repeats."""
    same = [r for r in ctx.rows(e) if r[e.title] == row[e.title]]
    s = f'the {e.label} "{row[e.title]}"'
    if len(same) == 1:
        return s
    for fname in [f for f in e.summary if f != e.title]:
        if sum(1 for r in same if r[fname] == row[fname]) == 1:
            return f"{s} ({e.field(fname).words} {fmt(row[fname])})"
    return None


def search_step(ctx: Ctx, e: Entity, query: str, agent: str | None = None, group: int | None = None) -> dict[str, Any]:
    """A gold search of `e` for `query`, asking for a bigger page when more than 10 rows match."""
    q = query.lower()
    hits = sum(1 for r in ctx.rows(e) if any(q in str(r.get(f, "")).lower() for f in e.search))
    args: dict[str, Any] = {"query": query}
    if hits > 10:
        args["limit"] = 50
    return tc(f"search_{e.plural}", args, agent, group)


def tc(name: str, args: dict[str, Any], agent: str | None = None, group: int | None = None, **kw: Any) -> dict[str, Any]:
    """A gold tool-call step (KeyError for a tool the catalog lacks); `kw` adds why / fallbacks."""
    if name not in TOOLS:
        raise KeyError(f"gold uses unknown tool {name}")
    s: dict[str, Any] = {"kind": "tool_call", "name": name, "arguments": args}
    if agent:
        s["agent"] = agent
    if group is not None:
        s["group"] = group
    s.update(kw)
    return s


def msg(text: str, why: str = "") -> dict[str, Any]:
    """A gold message to the user, with the reasoning that leads to it when given."""
    s = {"kind": "message", "text": text}
    if why:
        s["why"] = why
    return s


def sentence(s: str) -> str:
    """`s` ending with punctuation."""
    return s if s.endswith((".", "!", "?")) else s + "."


def delegate(agent: str, instruction: str) -> dict[str, Any]:
    """A gold hand-off of `instruction` to the sub-agent role `agent`."""
    return {"kind": "delegate", "agent": agent, "instruction": instruction}


CHITCHAT = [
    ("What's a good name for a grey cat?", "Maybe Pepper, Smokey or Miso."),
    ("Is it going to be a busy week?", "You have a few things on the calendar; I can go through them anytime."),
    ("Remind me what do not disturb does.", "It silences calls and notifications until you turn it off."),
    ("I started reading a new novel yesterday.", "Nice! Let me know if you want to track it in your book list."),
    ("My phone felt slow this morning.", "Closing unused apps or turning on low power mode can help."),
    ("Thanks for the help earlier.", "Anytime!"),
    ("I'm thinking of learning Spanish.", "Great idea; the phrasebook can help with common phrases."),
]


def chit(ctx: Ctx, k: int) -> list[dict[str, str]]:
    """`k` distinct chit-chat exchanges as user/assistant turns."""
    out = []
    for u, a in ctx.rng.sample(CHITCHAT, k):
        out += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return out


def with_history(ctx: Ctx, key_turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """Key turns hidden among distractor turns at a seeded position."""
    before = chit(ctx, ctx.rng.randint(0, 2))
    after = chit(ctx, ctx.rng.randint(1, 2))
    return before + key_turns + after


def done(ctx: Ctx, what: str) -> dict[str, Any]:
    """The closing message of a write task, in one of three seeded phrasings."""
    return msg(ctx.choice([f"Done: {what}.", f"All set. {what[0].upper() + what[1:]}.", f"I've taken care of it: {what}."]))


def pick_contact(ctx: Ctx, exclude: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """A contact that is not one of the persona's same-first-name twins: (row, name)."""
    twins = set(ctx.persona.twins)
    c = ctx.choice([r for r in ctx.rows("contact") if r["id"] not in twins and r["id"] not in exclude])
    return c, c["name"]


def sms_goal(c: dict[str, Any], value: Any) -> dict[str, Any]:
    """The goal "a text to contact `c` whose body contains `value`"."""
    return {"kind": "new_row", "entity": "sms", "name": "text_sent",
            "match": {"to_number": c["phone"], "direction": "out", "body": {"contains": fmt(value)}}}


def text_steps(ctx: Ctx, c: dict[str, Any], body: str, said: str, agent: str | None = None) -> list[dict[str, Any]]:
    """The gold of "text `body` to contact `c`": find the contact, send the text, say `said` (one of `done`'s phrasings)."""
    return [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"], agent=agent), tc("send_sms", {"to": c["id"], "body": body}, agent=agent),
            done(ctx, said)]


def saved_pair(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two distinct saved places that the user can name unambiguously."""
    places = [r for r in ctx.rows("saved_place") if describe(ctx, ENTITY_BY_NAME["saved_place"], r)]
    a, b = ctx.rng.sample(places, 2)
    return a, b
