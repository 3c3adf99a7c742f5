"""Templates derived from the catalog for every entity: create / update / delete / lookup and their variants.

Plain, memory, sub-agent and skill-family (share by text, save to note) variants, and hard ones: faults
to retry through, an offline device, a paged search, missing information to ask for. Registered for
each entity of `catalog.ENTITIES` in catalog order, before the hand-written scenarios.
"""
from __future__ import annotations

from typing import Any, Callable

from mpa_jax.envs.catalog import ENTITIES, ENTITY_BY_NAME, Entity, Field
from mpa_jax.envs.taskgen.common import (delegate, describe, done, fmt, join, msg, pick_contact, say, search_step, sentence,
                                         sms_goal, tc, text_steps, with_history)
from mpa_jax.envs.taskgen.registry import Ctx, template


def _new_values(ctx: Ctx, e: Entity, optional: bool = True) -> dict[str, Any] | None:
    vals: dict[str, Any] = {}
    existing = {r[e.title] for r in ctx.rows(e)}
    for f in e.fields:
        if f.derived or f.ref:
            continue
        if f.req or (optional and f.type != "bool" and ctx.rng.random() < 0.4):
            for _ in range(30):
                v = ctx.value(f)
                if f.name != e.title or f.type != "str" or v not in existing:
                    break
            else:
                return None
            vals[f.name] = v
    return vals


def _refs(ctx: Ctx, e: Entity) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Pick rows for each ref field: (args, search steps revealing their ids, phrases)."""
    args, steps, phrases = {}, [], []
    for f in e.fields:
        if f.ref:
            ref = ENTITY_BY_NAME[f.ref]
            cands = [r for r in ctx.rows(ref) if describe(ctx, ref, r) and sum(1 for x in ctx.rows(ref) if x[ref.title] == r[ref.title]) == 1]
            r = ctx.choice(cands)
            args[f.name] = r["id"]
            steps.append(search_step(ctx, ref, r[ref.title], group=0))
            phrases.append(f'{f.words} "{r[ref.title]}"')
    return args, steps, phrases


def create_parts(ctx: Ctx, e: Entity) -> tuple[dict[str, Any], list[dict[str, Any]], str, dict[str, Any]] | None:
    vals = _new_values(ctx, e)
    if vals is None:
        return None
    ref_args, ref_steps, ref_phrases = _refs(ctx, e)
    args = {**ref_args, **vals}
    parts = ref_phrases + [say(e.field(k), v) for k, v in vals.items()]
    goal = {"kind": "new_row", "entity": e.name, "match": dict(args), "name": f"created_{e.name}"}
    return args, ref_steps, join(parts), goal


def _pick_row(ctx: Ctx, e: Entity, pred: Callable[[dict[str, Any]], bool] = lambda r: True) -> tuple[dict[str, Any], str] | None:
    cands = [(r, d) for r in ctx.rows(e) if pred(r) for d in [describe(ctx, e, r)] if d]
    return ctx.choice(cands) if cands else None


def pick_lookup(ctx: Ctx, e: Entity) -> tuple[dict[str, Any], str, Field] | None:
    """A described row of `e` and one of its lookup fields (see `_lookup_fields`), or None."""
    picked = _pick_row(ctx, e)
    if picked is None:
        return None
    row, desc = picked
    fields = _lookup_fields(e, row)
    return (row, desc, ctx.choice(fields)) if fields else None


def updatable(e: Entity) -> list[Field]:
    return [f for f in e.fields if f.updatable and not f.derived and not f.ref]


def new_value_for(ctx: Ctx, e: Entity, f: Field, old: Any) -> Any:
    existing = {r[f.name] for r in ctx.rows(e)} if f.name == e.title else set()
    for _ in range(30):
        v = (not old) if f.type == "bool" else ctx.value(f)
        if v != old and v not in existing:
            return v
    return None


def _lookup_fields(e: Entity, row: dict[str, Any]) -> list[Field]:
    out = []
    for f in e.fields:
        v = row.get(f.name)
        if f.name == e.title or f.type == "bool" or f.ref or v is None:
            continue
        if isinstance(v, str) and len(v) < 4:
            continue
        out.append(f)
    non_summary = [f for f in out if f.name not in e.summary]
    return non_summary or out


def lookupable(e: Entity) -> bool:
    """Whether `e` has lookup templates (and a follow-up share): searchable, gettable, with a field to ask for."""
    return "s" in e.ops and "g" in e.ops and any(f.name != e.title and f.type != "bool" and not f.ref for f in e.fields)


def lookup_question(ctx: Ctx, e: Entity, row: dict[str, Any], desc: str, f: Field) -> tuple[str, list[dict[str, Any]]]:
    """The question for field `f` of `row` and its gold (search, get, the answer): the `lookup` template's and the
    first turn of `followup_share`."""
    question = ctx.choice([f"What is the {f.words} of {desc}?", f"Tell me the {f.words} of {desc}."])
    return question, [search_step(ctx, e, row[e.title]), tc(f"get_{e.name}", {"id": row["id"]}),
                      msg(sentence(f"The {f.words} of {desc} is {fmt(row[f.name])}"))]


def shown(f: Field, v: Any) -> str:
    """`v` as a change request quotes it (strings quoted)."""
    return f'"{v}"' if f.type == "str" else fmt(v)


def _answer_value(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _gen_create(e: Entity, variant: str) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        parts = create_parts(ctx, e)
        if parts is None:
            return None
        args, ref_steps, desc, goal = parts
        create = tc(f"create_{e.name}", args)
        out: dict[str, Any] = {"gold": ref_steps + [create, done(ctx, f"the {e.label} is created")], "verifier": {"goals": [goal]}}
        verb = ctx.choice(["Add", "Create", "Please add", "Can you create"])
        out["instruction"] = f"{verb} a {e.label} with {desc}."
        if variant == "fault":
            code = ctx.choice(["TRANSIENT", "RATE_LIMITED"])
            out["faults"] = [{"tool": create["name"], "code": code, "on_calls": [1],
                              "message": "the service is busy, try again" if code == "RATE_LIMITED" else "temporary failure",
                              "hint": "retry the same call"}]
        elif variant == "memory":
            out["history"] = with_history(ctx, [
                {"role": "user", "content": f"Later today I'll want a {e.label} with {desc}. Don't add it yet."},
                {"role": "assistant", "content": "Got it, I'll wait until you tell me."}])
            out["instruction"] = ctx.choice([f"Go ahead and add the {e.label} I described earlier.",
                                             f"Now please create that {e.label} we talked about."])
        elif variant == "missing":
            req = [f for f in e.fields if f.req and f.name != e.title and f.name in args]
            if any(f.ref for f in e.fields) or not req or e.title not in args:
                return None
            drop = ctx.choice(req)
            shown = [say(e.field(k), v) for k, v in args.items() if k != drop.name]
            out["instruction"] = f"{verb} a {e.label} with {join(shown)}."
            out["gold"] = [msg(f"Sure. What {drop.words} should the {e.label} have?",
                               why=f"The request has no {drop.words}; I should ask rather than guess.")]
            keyword = drop.words.split(" in ")[0].split()[-1]  # "due date" -> "date", "weight in kg" -> "weight"
            out["verifier"] = {"goals": [], "answer": {"kind": "ask", "contains": [keyword]},
                               "minefields": [{"kind": "new_row", "entity": e.name, "match": {}, "name": f"guessed_{e.name}"}]}
            out["extra_tools"] = [f"create_{e.name}"]
        return out
    return fn


def _gen_update(e: Entity, variant: str) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = _pick_row(ctx, e)
        if picked is None:
            return None
        row, desc = picked
        fields = updatable(e)
        if not fields:
            return None
        f = ctx.choice(fields)
        v = new_value_for(ctx, e, f, row.get(f.name))
        if v is None:
            return None
        finder, editor = "planner", "planner"
        gold: list[dict[str, Any]] = []
        if variant == "subagent":
            finder, editor = "finder", "editor"
            gold.append(delegate("finder", f"Find {desc} and report its id."))
        gold.append(search_step(ctx, e, row[e.title], agent=finder if finder != "planner" else None))
        if variant == "subagent":
            gold.append(delegate("editor", f"Set the {f.words} of {row['id']} to {fmt(v)}."))
        gold.append(tc(f"update_{e.name}", {"id": row["id"], f.name: v}, agent=editor if editor != "planner" else None))
        gold.append(done(ctx, f"{desc} now has {say(f, v)}"))
        change = f"change the {f.words} of {desc} to {shown(f, v)}" if f.type != "bool" else f"turn {f.words} {'on' if v else 'off'} for {desc}"
        out: dict[str, Any] = {"gold": gold, "instruction": change[0].upper() + change[1:] + ".",
                               "verifier": {"goals": [{"kind": "field", "entity": e.name, "id": row["id"], "values": {f.name: v}}]}}
        if variant == "memory":
            out["history"] = with_history(ctx, [
                {"role": "user", "content": f"At some point I need to {change}. Not now though."},
                {"role": "assistant", "content": "Okay, just say when."}])
            out["instruction"] = ctx.choice([f"Now make the change to my {e.label} that I mentioned before.",
                                             f"Please do that {e.label} change I told you about earlier."])
        elif variant == "offline":
            if e.online:
                out["initial_state"] = {"device": {"airplane_mode": True}}
                out["verifier"]["allow"] = ["device.airplane_mode"]
                out["extra_tools"] = ["set_airplane_mode"]
            else:
                out["faults"] = [{"tool": f"search_{e.plural}", "code": "TRANSIENT", "on_calls": [1],
                                  "message": "temporary failure", "hint": "retry the same call"}]
        elif variant == "subagent":
            out["roles"] = {"planner": [], "finder": [f"search_{e.plural}", f"get_{e.name}"],
                            "editor": [f"update_{e.name}"] + ([f"delete_{e.name}"] if "d" in e.ops else [])}
            out["verifier"]["milestones"] = [{"tool": f"search_{e.plural}", "agent": "finder"},
                                             {"tool": f"update_{e.name}", "agent": "editor"}]
        return out
    return fn


def _gen_delete(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = _pick_row(ctx, e)
        if picked is None:
            return None
        row, desc = picked
        verb = ctx.choice(["Delete", "Remove", "Please delete"])
        return {"instruction": f"{verb} {desc}.",
                "gold": [search_step(ctx, e, row[e.title]), tc(f"delete_{e.name}", {"id": row["id"]}), done(ctx, f"{desc} is deleted")],
                "verifier": {"goals": [{"kind": "deleted", "entity": e.name, "id": row["id"]}]}}
    return fn


def _gen_lookup(e: Entity, variant: str) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        question, gold = lookup_question(ctx, e, row, desc, f)
        out: dict[str, Any] = {"instruction": question,
                               "gold": gold, "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [_answer_value(v)]}}}
        if variant == "memory":
            out["history"] = with_history(ctx, [
                {"role": "user", "content": f"When I say 'my usual {e.label}', I mean {desc}."},
                {"role": "assistant", "content": "Noted."}])
            out["instruction"] = f"What is the {f.words} of my usual {e.label}?"
        elif variant == "paged":
            # the search service returns an empty first page with has_more: the planner must ask for the next page
            out["faults"] = [{"tool": f"search_{e.plural}", "page_size": 0, "on_calls": [1]}]
        elif variant == "subagent":
            c, _ = pick_contact(ctx)
            body = f"The {f.words} of {row[e.title]}: {fmt(v)}"
            out["instruction"] = f"Find the {f.words} of {desc} and text it to {c['name']}."
            out["roles"] = {"planner": [], "researcher": [f"search_{e.plural}", f"get_{e.name}"],
                            "messenger": ["search_contacts", "send_sms"]}
            out["gold"] = [delegate("researcher", f"Find the {f.words} of {desc}."), *[dict(s, agent="researcher") for s in gold[:2]],
                           delegate("messenger", f"Text {c['name']}: {body}"),
                           *text_steps(ctx, c, body, f"I texted {c['name']} the {f.words} of {row[e.title]}", agent="messenger")]
            out["verifier"] = {"goals": [sms_goal(c, v)],
                               "milestones": [{"tool": f"get_{e.name}", "agent": "researcher"}, {"tool": "send_sms", "agent": "messenger"}]}
        return out
    return fn


def _gen_share(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        c, _ = pick_contact(ctx)
        body = f"The {f.words} of {row[e.title]}: {fmt(v)}"
        return {"instruction": ctx.choice([f"Look up the {f.words} of {desc} and text it to {c['name']}.",
                                           f"Send {c['name']} a text with the {f.words} of {desc}."]),
                "gold": [search_step(ctx, e, row[e.title], group=1), search_step(ctx, ENTITY_BY_NAME["contact"], c["name"], group=1),
                         tc(f"get_{e.name}", {"id": row["id"]}), tc("send_sms", {"to": c["id"], "body": body}),
                         done(ctx, f"I texted {c['name']} the {f.words}")],
                "verifier": {"goals": [sms_goal(c, v)],
                             "milestones": [{"tool": f"get_{e.name}"}, {"tool": "send_sms", "args": {"to": c["id"]}}]}}
    return fn


def _gen_to_note(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        title = f"{row[e.title]} - {f.words}"
        if any(n["title"] == title for n in ctx.rows("note")):
            return None
        return {"instruction": f'Save the {f.words} of {desc} in a new note titled "{title}".',
                "gold": [search_step(ctx, e, row[e.title]), tc(f"get_{e.name}", {"id": row["id"]}),
                         tc("create_note", {"title": title, "body": f"{f.words}: {fmt(v)}"}), done(ctx, f'the note "{title}" is saved')],
                "verifier": {"goals": [{"kind": "new_row", "entity": "note", "name": "note_saved",
                                        "match": {"title": title, "body": {"contains": fmt(v)}}}],
                             "milestones": [{"tool": f"get_{e.name}"}, {"tool": "create_note"}]}}
    return fn


def _register_entity_templates() -> None:
    for e in ENTITIES:
        d = e.domain
        if "c" in e.ops:
            template(f"{e.name}.create", d, "tool_use", 1)(_gen_create(e, "plain"))
            template(f"{e.name}.create_retry", d, "tool_use", 3, 0.5)(_gen_create(e, "fault"))
            template(f"{e.name}.create_mem", d, "memory", 2)(_gen_create(e, "memory"))
            if sum(1 for f in e.fields if f.req) >= 2 and not any(f.ref for f in e.fields):
                template(f"{e.name}.create_ask", d, "tool_use", 3, 0.5)(_gen_create(e, "missing"))
        if "u" in e.ops and "s" in e.ops:
            template(f"{e.name}.update", d, "tool_use", 1)(_gen_update(e, "plain"))
            template(f"{e.name}.update_mem", d, "memory", 2)(_gen_update(e, "memory"))
            template(f"{e.name}.update_recover", d, "tool_use", 3, 0.5)(_gen_update(e, "offline"))
            template(f"{e.name}.update_sub", d, "subagent", 3)(_gen_update(e, "subagent"))
        if "d" in e.ops and "s" in e.ops:
            template(f"{e.name}.delete", d, "tool_use", 1)(_gen_delete(e))
        if lookupable(e):
            template(f"{e.name}.lookup", d, "tool_use", 1)(_gen_lookup(e, "plain"))
            template(f"{e.name}.lookup_mem", d, "memory", 2)(_gen_lookup(e, "memory"))
            template(f"{e.name}.lookup_paged", d, "tool_use", 3, 0.5)(_gen_lookup(e, "paged"))
            template(f"{e.name}.lookup_sub", d, "subagent", 3)(_gen_lookup(e, "subagent"))
            template(f"{e.name}.share", d, "skills", 2, family="share_by_text")(_gen_share(e))
            if e.name != "note":
                template(f"{e.name}.to_note", d, "skills", 2, family="save_to_note")(_gen_to_note(e))


_register_entity_templates()
