"""Follow-up conversations (category "followup"): the user's first request, the planner's reply, then the
user's next turn, which builds on what the first turn did or found.

The next turn is hidden until the planner replies: the sandbox answers the planner's message with
`Feedback.user_turn` (contract version 2) while `task.metadata["followups"]` has turns left, and the episode
goes on; a reply with no turn left ends it. Verification is by the end state (and the ledger), as for every
sandbox task, so the planner has to carry the first turn's result into the second:

- `<entity>.followup_amend`: "Add a reminder with ..." -> reply -> "Actually, make the time 15:00." The new row
  must end with the amended value (an update of the row just created; a second row is collateral).
- `<entity>.followup_share`: "What is the phone of ...?" -> reply -> "Thanks, text that to Ana." The text to Ana
  must carry the value the first turn looked up (the follow-up never repeats it).
- `followup.convert_then_text`: a unit conversion, then "text that to <contact>".

Catalog-derived like `entities.py` (every domain has an entity with create and update), registered after
`composite.py` so that the templates registered before keep their order, names and tasks.
"""
from __future__ import annotations

from typing import Any, Callable

from mpa_jax.envs.catalog import ENTITIES, Entity
from mpa_jax.envs.taskgen.common import done, fmt, msg, pick_contact, sms_goal, tc, text_steps
from mpa_jax.envs.taskgen.entities import create_parts, lookup_question, lookupable, new_value_for, pick_lookup, shown, updatable
from mpa_jax.envs.taskgen.registry import Ctx, template
from mpa_jax.envs.tools import convert

CATEGORY = "followup"
FOLLOWUPS_KEY = "followups"  # task.metadata key: the user's later turns, in order (read by SandboxEnv)


def _amend(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        parts = create_parts(ctx, e)
        if parts is None:
            return None
        args, ref_steps, desc, _ = parts
        fields = updatable(e)
        given = [f for f in fields if f.name in args]
        if not fields:
            return None
        f = ctx.choice(given or fields)
        v = new_value_for(ctx, e, f, args.get(f.name))
        if v is None:
            return None
        new_id = f"{e.name}_{len(ctx.rows(e)) + 1}"  # ids are row counters: the row the first turn creates
        turn = (f"Actually, turn {f.words} {'on' if v else 'off'} for it." if f.type == "bool"
                else ctx.choice([f"Actually, make the {f.words} {shown(f, v)}.", f"Oh wait, change the {f.words} to {shown(f, v)}."]))
        verb = ctx.choice(["Add", "Create", "Please add"])
        article = "an" if e.label[0] in "aeiou" else "a"
        return {"instruction": f"{verb} {article} {e.label} with {desc}.",
                "gold": ref_steps + [tc(f"create_{e.name}", args), done(ctx, f"the {e.label} is created"),
                                     tc(f"update_{e.name}", {"id": new_id, f.name: v}),
                                     done(ctx, f"the {e.label} now has {f.words} {fmt(v)}")],
                "verifier": {"goals": [{"kind": "new_row", "entity": e.name, "name": f"amended_{e.name}",
                                        "match": {**args, f.name: v}}]},
                "metadata": {FOLLOWUPS_KEY: [turn]}}
    return fn


def _share(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        c, _ = pick_contact(ctx)
        turn = ctx.choice([f"Thanks. Can you text that to {c['name']}?", f"Great, now send that to {c['name']} by text."])
        question, first = lookup_question(ctx, e, row, desc, f)  # the lookup template's question, then the text
        return {"instruction": question,
                "gold": first + text_steps(ctx, c, f"The {f.words} of {row[e.title]}: {fmt(v)}", f"I texted {c['name']} the {f.words}"),
                "verifier": {"goals": [sms_goal(c, v)]},
                "metadata": {FOLLOWUPS_KEY: [turn]}}
    return fn


@template("followup.convert_then_text", "utilities", CATEGORY, 2)
def convert_then_text(ctx: Ctx) -> dict[str, Any]:
    a, b = ctx.choice([("km", "mi"), ("mi", "km"), ("lb", "kg"), ("C", "F"), ("F", "C"), ("l", "gal"), ("cm", "in")])
    v = ctx.choice([5, 10, 12.5, 21, 37, 42, 100])
    r = f"{convert(v, a, b):.2f}"
    c, _ = pick_contact(ctx)
    return {"instruction": ctx.choice([f"Convert {fmt(v)} {a} to {b}.", f"How much is {fmt(v)} {a} in {b}?"]),
            "gold": [tc("convert_units", {"value": v, "from_unit": a, "to_unit": b}), msg(f"{fmt(v)} {a} is {r} {b}."),
                     *text_steps(ctx, c, f"{fmt(v)} {a} is {r} {b}", f"I texted {c['name']}")],
            "verifier": {"goals": [sms_goal(c, r)]},
            "metadata": {FOLLOWUPS_KEY: [ctx.choice([f"Now text that number to {c['name']}.",
                                                     f"Send that to {c['name']}, please."])]}}


def _register() -> None:
    for e in ENTITIES:
        if "c" in e.ops and "u" in e.ops and updatable(e):
            template(f"{e.name}.followup_amend", e.domain, CATEGORY, 2, 0.5)(_amend(e))
        if lookupable(e):
            template(f"{e.name}.followup_share", e.domain, CATEGORY, 2, 0.5)(_share(e))


_register()
