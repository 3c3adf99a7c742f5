"""Task generators: templates per domain and category, each producing tasks with a gold solution.

Most templates are derived from the catalog for every entity (create / update / delete / lookup, their
memory, skill-family and sub-agent variants, and hard variants: faults, offline device, missing
information); the rest are hand-written scenarios over the handler tools (the seed scenario, unit
conversion with rejected units, ambiguous contacts, refusals, multi-app chains).

A template is `fn(ctx) -> dict | None` returning the task's instruction, gold plan, verifier and extras;
None means "this instance cannot be built" (the generator draws another seed). Tools a task allows are
the tools its gold uses plus distractors. Every candidate then goes through the quality gate (gate.py).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any, Callable

from mpa_jax.envs.catalog import ENTITIES, ENTITY_BY_NAME, POOLS, Entity, Field
from mpa_jax.envs.tools import LANGUAGES, MODES, PHRASES, RATES, TOOLS, city_time, convert, fx, route_km, weather
from mpa_jax.envs.world import persona_world, sample_value, stable_hash

GENERATOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    domain: str
    category: str
    difficulty: int
    fn: Callable[["Ctx"], dict[str, Any] | None]
    weight: float = 1.0  # relative number of instances per split
    family: str = ""  # skill family (skills tasks share a procedure)

    @property
    def held_out(self) -> bool:
        """About one template in eight never appears in train (template-level hold-out)."""
        return stable_hash("holdout", self.name) % 8 == 0 and not self.name.startswith("seed")


TEMPLATES: list[Template] = []


class Ctx:
    """What a template may read: the persona facts and rows of its world, and a seeded rng."""

    def __init__(self, persona_seed: int, rng: random.Random) -> None:
        self.persona, _, rows = persona_world(persona_seed)
        self.rng = rng
        self._rows = rows

    @property
    def today(self) -> dt.date:
        return dt.date.fromisoformat(self.persona.now[:10])

    def rows(self, e: Entity | str) -> list[dict[str, Any]]:
        e = ENTITY_BY_NAME[e] if isinstance(e, str) else e
        return [{"id": f"{e.name}_{i + 1}", **r} for i, r in enumerate(self._rows[e.name])]

    def row(self, e: Entity | str, rid: str) -> dict[str, Any]:
        e = ENTITY_BY_NAME[e] if isinstance(e, str) else e
        return {"id": rid, **self._rows[e.name][int(rid.rsplit("_", 1)[1]) - 1]}

    def value(self, f: Field) -> Any:
        return sample_value(f, self.rng, self.today)

    def choice(self, xs: list[Any]) -> Any:
        return self.rng.choice(xs)


# ------------------------------------------------------------------------------------------ phrasing


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def say(f: Field, v: Any) -> str:
    if f.type == "bool":
        return f"{f.words} {'on' if v else 'off'}"
    if f.type in ("str",) and not f.ref:
        return f'{f.words} "{v}"'
    return f"{f.words} {fmt(v)}"


def join(parts: list[str]) -> str:
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
    q = query.lower()
    hits = sum(1 for r in ctx.rows(e) if any(q in str(r.get(f, "")).lower() for f in e.search))
    args: dict[str, Any] = {"query": query}
    if hits > 10:
        args["limit"] = 50
    return _tc(f"search_{e.plural}", args, agent, group)


def _tc(name: str, args: dict[str, Any], agent: str | None = None, group: int | None = None, **kw: Any) -> dict[str, Any]:
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
    s = {"kind": "message", "text": text}
    if why:
        s["why"] = why
    return s


def sentence(s: str) -> str:
    return s if s.endswith((".", "!", "?")) else s + "."


def delegate(agent: str, instruction: str) -> dict[str, Any]:
    return {"kind": "delegate", "agent": agent, "instruction": instruction}


def template(name: str, domain: str, category: str, difficulty: int = 1, weight: float = 1.0, family: str = ""):
    def wrap(fn: Callable[[Ctx], dict[str, Any] | None]) -> Callable:
        TEMPLATES.append(Template(name, domain, category, difficulty, fn, weight, family))
        return fn
    return wrap


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
    out = []
    for u, a in ctx.rng.sample(CHITCHAT, k):
        out += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return out


def with_history(ctx: Ctx, key_turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """Key turns hidden among distractor turns at a seeded position."""
    before = chit(ctx, ctx.rng.randint(0, 2))
    after = chit(ctx, ctx.rng.randint(1, 2))
    return before + key_turns + after


# ------------------------------------------------------------------------------------------ generic entity templates


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


def _create_parts(ctx: Ctx, e: Entity) -> tuple[dict[str, Any], list[dict[str, Any]], str, dict[str, Any]] | None:
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


def _pick_lookup(ctx: Ctx, e: Entity) -> tuple[dict[str, Any], str, Field] | None:
    """A described row of `e` and one of its lookup fields (see `_lookup_fields`), or None."""
    picked = _pick_row(ctx, e)
    if picked is None:
        return None
    row, desc = picked
    fields = _lookup_fields(e, row)
    return (row, desc, ctx.choice(fields)) if fields else None


def _updatable(e: Entity) -> list[Field]:
    return [f for f in e.fields if f.updatable and not f.derived and not f.ref]


def _new_value_for(ctx: Ctx, e: Entity, f: Field, old: Any) -> Any:
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


def _answer_value(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _done(ctx: Ctx, what: str) -> dict[str, Any]:
    return msg(ctx.choice([f"Done: {what}.", f"All set. {what[0].upper() + what[1:]}.", f"I've taken care of it: {what}."]))


def _gen_create(e: Entity, variant: str) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        parts = _create_parts(ctx, e)
        if parts is None:
            return None
        args, ref_steps, desc, goal = parts
        create = _tc(f"create_{e.name}", args)
        out: dict[str, Any] = {"gold": ref_steps + [create, _done(ctx, f"the {e.label} is created")], "verifier": {"goals": [goal]}}
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
        fields = _updatable(e)
        if not fields:
            return None
        f = ctx.choice(fields)
        v = _new_value_for(ctx, e, f, row.get(f.name))
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
        gold.append(_tc(f"update_{e.name}", {"id": row["id"], f.name: v}, agent=editor if editor != "planner" else None))
        gold.append(_done(ctx, f"{desc} now has {say(f, v)}"))
        shown = f'"{v}"' if f.type == "str" else fmt(v)
        change = f"change the {f.words} of {desc} to {shown}" if f.type != "bool" else f"turn {f.words} {'on' if v else 'off'} for {desc}"
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
                "gold": [search_step(ctx, e, row[e.title]), _tc(f"delete_{e.name}", {"id": row["id"]}), _done(ctx, f"{desc} is deleted")],
                "verifier": {"goals": [{"kind": "deleted", "entity": e.name, "id": row["id"]}]}}
    return fn


def _gen_lookup(e: Entity, variant: str) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = _pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        gold = [search_step(ctx, e, row[e.title]), _tc(f"get_{e.name}", {"id": row["id"]}),
                msg(sentence(f"The {f.words} of {desc} is {fmt(v)}"))]
        out: dict[str, Any] = {"instruction": ctx.choice([f"What is the {f.words} of {desc}?", f"Tell me the {f.words} of {desc}."]),
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
            c, _ = _pick_contact(ctx)
            body = f"The {f.words} of {row[e.title]}: {fmt(v)}"
            out["instruction"] = f"Find the {f.words} of {desc} and text it to {c['name']}."
            out["roles"] = {"planner": [], "researcher": [f"search_{e.plural}", f"get_{e.name}"],
                            "messenger": ["search_contacts", "send_sms"]}
            out["gold"] = [delegate("researcher", f"Find the {f.words} of {desc}."), *[dict(s, agent="researcher") for s in gold[:2]],
                           delegate("messenger", f"Text {c['name']}: {body}"),
                           search_step(ctx, ENTITY_BY_NAME["contact"], c["name"], agent="messenger"),
                           _tc("send_sms", {"to": c["id"], "body": body}, agent="messenger"),
                           _done(ctx, f"I texted {c['name']} the {f.words} of {row[e.title]}")]
            out["verifier"] = {"goals": [_sms_goal(c, v)],
                               "milestones": [{"tool": f"get_{e.name}", "agent": "researcher"}, {"tool": "send_sms", "agent": "messenger"}]}
        return out
    return fn


def _pick_contact(ctx: Ctx, exclude: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    twins = set(ctx.persona.twins)
    c = ctx.choice([r for r in ctx.rows("contact") if r["id"] not in twins and r["id"] not in exclude])
    return c, c["name"]


def _sms_goal(c: dict[str, Any], value: Any) -> dict[str, Any]:
    return {"kind": "new_row", "entity": "sms", "name": "text_sent",
            "match": {"to_number": c["phone"], "direction": "out", "body": {"contains": fmt(value)}}}


def _gen_share(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = _pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        c, _ = _pick_contact(ctx)
        body = f"The {f.words} of {row[e.title]}: {fmt(v)}"
        return {"instruction": ctx.choice([f"Look up the {f.words} of {desc} and text it to {c['name']}.",
                                           f"Send {c['name']} a text with the {f.words} of {desc}."]),
                "gold": [search_step(ctx, e, row[e.title], group=1), search_step(ctx, ENTITY_BY_NAME["contact"], c["name"], group=1),
                         _tc(f"get_{e.name}", {"id": row["id"]}), _tc("send_sms", {"to": c["id"], "body": body}),
                         _done(ctx, f"I texted {c['name']} the {f.words}")],
                "verifier": {"goals": [_sms_goal(c, v)],
                             "milestones": [{"tool": f"get_{e.name}"}, {"tool": "send_sms", "args": {"to": c["id"]}}]}}
    return fn


def _gen_to_note(e: Entity) -> Callable[[Ctx], dict[str, Any] | None]:
    def fn(ctx: Ctx) -> dict[str, Any] | None:
        picked = _pick_lookup(ctx, e)
        if picked is None:
            return None
        row, desc, f = picked
        v = row[f.name]
        title = f"{row[e.title]} - {f.words}"
        if any(n["title"] == title for n in ctx.rows("note")):
            return None
        return {"instruction": f'Save the {f.words} of {desc} in a new note titled "{title}".',
                "gold": [search_step(ctx, e, row[e.title]), _tc(f"get_{e.name}", {"id": row["id"]}),
                         _tc("create_note", {"title": title, "body": f"{f.words}: {fmt(v)}"}), _done(ctx, f'the note "{title}" is saved')],
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
        if "s" in e.ops and "g" in e.ops and any(f.name != e.title and f.type != "bool" and not f.ref for f in e.fields):
            template(f"{e.name}.lookup", d, "tool_use", 1)(_gen_lookup(e, "plain"))
            template(f"{e.name}.lookup_mem", d, "memory", 2)(_gen_lookup(e, "memory"))
            template(f"{e.name}.lookup_paged", d, "tool_use", 3, 0.5)(_gen_lookup(e, "paged"))
            template(f"{e.name}.lookup_sub", d, "subagent", 3)(_gen_lookup(e, "subagent"))
            template(f"{e.name}.share", d, "skills", 2, family="share_by_text")(_gen_share(e))
            if e.name != "note":
                template(f"{e.name}.to_note", d, "skills", 2, family="save_to_note")(_gen_to_note(e))


_register_entity_templates()

# ------------------------------------------------------------------------------------------ handler scenarios

COACH_FACTOR = 2.20462


def _seed_like(ctx: Ctx, kg: float) -> dict[str, Any]:
    coach = ctx.row("contact", ctx.persona.roles["coach"])
    lb = round(kg * COACH_FACTOR, 2)
    body = f"{fmt(kg)} kg is {lb:.2f} lb."
    expr = f"{fmt(kg)} * {COACH_FACTOR}"
    history = with_history(ctx, [
        {"role": "user", "content": f"I've started training with {coach['name']}. They're my coach now and want weekly weigh-ins."},
        {"role": "assistant", "content": f"Great, I'll remember that {coach['name']} is your coach."}])
    calc = _tc("calculate", {"expression": expr}, why=f"The converter doesn't take kilograms, so I'll compute it: 1 kg = {COACH_FACTOR} lb.")
    kg_try2 = _tc("convert_units", {"value": kg, "from_unit": "kilograms", "to_unit": "pounds"},
                  why="It rejected 'kg'; maybe it wants full unit names.", fallbacks=[calc])
    return {
        "history": history,
        "gold": [
            _tc("convert_units", {"value": kg, "from_unit": "kg", "to_unit": "lb"}, fallbacks=[kg_try2, calc]),
            search_step(ctx, ENTITY_BY_NAME["contact"], coach["name"]),
            _tc("send_sms", {"to": coach["id"], "body": body}),
            msg(f"{fmt(kg)} kg is {lb:.2f} lb; I texted that to your coach {coach['name']}."),
        ],
        "faults": [{"tool": "convert_units", "code": "UNSUPPORTED_VALUE", "when": {"from_unit": ["kg", "kilograms"]},
                    "message": "mass unit not supported by this converter",
                    "hint": "kilogram conversions are unavailable; use calculate with 1 kg = 2.20462 lb"}],
        "verifier": {"goals": [_sms_goal(coach, f"{lb:.2f}")], "answer": {"kind": "answer", "contains": [lb]},
                     "milestones": [{"tool": "calculate"}, {"tool": "send_sms", "args": {"to": coach["id"]}}]},
        "metadata": {"seed_scenario": True},
    }


@template("seed.coach_70kg", "utilities", "memory", 3, weight=1.0)
def seed_coach(ctx: Ctx) -> dict[str, Any]:
    out = _seed_like(ctx, 70)
    out["instruction"] = "Convert 70 kg to pounds and text it to my coach."
    return out


@template("convert.text_coach", "health_fitness", "memory", 3)
def convert_text_coach(ctx: Ctx) -> dict[str, Any]:
    kg = ctx.choice([58, 61.5, 64, 72, 75.5, 80, 83, 88, 91.2])
    out = _seed_like(ctx, kg)
    out["instruction"] = ctx.choice([f"Convert {fmt(kg)} kg to pounds and send it to my coach.",
                                     f"I weigh {fmt(kg)} kg today. Text my coach the weight in pounds."])
    return out


@template("convert.units", "utilities", "tool_use", 1, weight=3)
def convert_units_t(ctx: Ctx) -> dict[str, Any]:
    pairs = [("km", "mi"), ("mi", "km"), ("lb", "kg"), ("g", "oz"), ("C", "F"), ("F", "C"), ("l", "gal"), ("ft", "m"),
             ("cm", "in"), ("mph", "kmh"), ("oz", "g"), ("m", "ft")]
    a, b = ctx.choice(pairs)
    v = ctx.choice([3, 5, 10, 12.5, 21, 26.2, 37, 42, 100, 180, 250])
    r = convert(v, a, b)
    return {"instruction": ctx.choice([f"Convert {fmt(v)} {a} to {b}.", f"How much is {fmt(v)} {a} in {b}?"]),
            "gold": [_tc("convert_units", {"value": v, "from_unit": a, "to_unit": b}), msg(f"{fmt(v)} {a} is {r:g} {b}.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [round(r, 2)]}}}


@template("convert.fallback_calc", "utilities", "tool_use", 3, weight=2)
def convert_fallback(ctx: Ctx) -> dict[str, Any]:
    a, b, long_a, long_b, factor = ctx.choice([("mi", "km", "miles", "kilometers", 1.609344), ("lb", "kg", "pounds", "kilograms", 0.45359237),
                                                ("ft", "m", "feet", "meters", 0.3048), ("gal", "l", "gallons", "liters", 3.785411784)])
    v = ctx.choice([4, 6, 15, 26.2, 40, 150])
    r = round(v * factor, 2)
    calc = _tc("calculate", {"expression": f"{fmt(v)} * {factor}"}, why=f"The converter won't take {a}; 1 {a} = {factor} {b}, so I'll calculate.")
    return {"instruction": f"How many {long_b} is {fmt(v)} {long_a}?",
            "gold": [_tc("convert_units", {"value": v, "from_unit": a, "to_unit": b},
                         fallbacks=[_tc("convert_units", {"value": v, "from_unit": long_a, "to_unit": long_b}), calc]),
                     msg(f"{fmt(v)} {long_a} is about {r:.2f} {long_b}.")],
            "faults": [{"tool": "convert_units", "code": "UNSUPPORTED_VALUE", "when": {"from_unit": [a, long_a]},
                        "message": f"unit {a} is temporarily unsupported", "hint": "use calculate with the standard factor"}],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("calc.tip_split", "utilities", "tool_use", 1, weight=2)
def tip_split(ctx: Ctx) -> dict[str, Any]:
    bill = ctx.choice([48.6, 72.0, 86.4, 120.0, 135.5, 64.2])
    tip = ctx.choice([10, 15, 18, 20])
    n = ctx.choice([2, 3, 4])
    expr = f"{fmt(bill)} * (1 + {tip} / 100) / {n}"
    r = round(bill * (1 + tip / 100) / n, 2)
    return {"instruction": f"Our bill is {fmt(bill)} dollars. With a {tip}% tip, split {n} ways, how much does each person pay?",
            "gold": [_tc("calculate", {"expression": expr}), msg(f"Each person pays {r:.2f} dollars.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("fx.convert", "utilities", "tool_use", 1, weight=2)
def fx_convert(ctx: Ctx) -> dict[str, Any]:
    a, b = ctx.rng.sample(sorted(RATES), 2)
    amt = ctx.choice([20, 50, 75, 120, 300, 1000])
    r = fx(amt, a, b)
    return {"instruction": f"How much is {amt} {a} in {b}?",
            "gold": [_tc("convert_currency", {"amount": amt, "from_currency": a, "to_currency": b}), msg(f"{amt} {a} is {r:.2f} {b}.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [r]}}}


@template("weather.forecast", "utilities", "tool_use", 1, weight=2)
def weather_t(ctx: Ctx) -> dict[str, Any]:
    city = ctx.choice(sorted(set(POOLS["tz_city"])))
    days = ctx.choice([0, 1, 2, 3])
    date = (ctx.today + dt.timedelta(days=days)).isoformat()
    w = weather(city, date)
    when = {0: "today", 1: "tomorrow"}.get(days, f"on {date}")
    return {"instruction": f"What's the high temperature in {city} {when}?",
            "gold": [_tc("get_weather", {"city": city, "date": date}), msg(f"The high in {city} {when} is {w['high_c']} C ({w['condition']}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [w["high_c"]]}}}


@template("weather.offline", "device_settings", "tool_use", 3)
def weather_offline(ctx: Ctx) -> dict[str, Any]:
    out = weather_t(ctx)
    out["initial_state"] = {"device": {"airplane_mode": True}}
    out["verifier"]["allow"] = ["device.airplane_mode"]
    out["extra_tools"] = ["set_airplane_mode"]
    return out


@template("translate.phrase", "utilities", "tool_use", 1)
def translate_t(ctx: Ctx) -> dict[str, Any]:
    phrase = ctx.choice(sorted(PHRASES))
    lang = ctx.choice(LANGUAGES)
    tr = PHRASES[phrase][lang]
    return {"instruction": f'How do I say "{phrase}" in {lang.capitalize()}?',
            "gold": [_tc("translate_text", {"text": phrase, "target_language": lang}), msg(f'In {lang.capitalize()}: "{tr}".')],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [tr]}}}


@template("clock.time_in_city", "clock_alarms", "tool_use", 1, weight=2)
def time_in_city(ctx: Ctx) -> dict[str, Any]:
    city = ctx.choice([c for c in sorted(set(POOLS["tz_city"])) if c != ctx.persona.home_city])
    t = city_time(ctx.persona.now, ctx.persona.home_city, city)
    return {"instruction": f"What time is it in {city} right now?",
            "gold": [_tc("get_time_in_city", {"city": city}), msg(f"It's {t[11:]} in {city} ({t[:10]}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [t[11:]]}}}


@template("sms.contact", "communication", "tool_use", 1, weight=2)
def sms_contact(ctx: Ctx) -> dict[str, Any]:
    c, _ = _pick_contact(ctx)
    body = ctx.choice(POOLS["reply"])
    return {"instruction": f'Text {c["name"]}: "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), _tc("send_sms", {"to": c["id"], "body": body}),
                     _done(ctx, f"I texted {c['name']}")],
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
    c, _ = _pick_contact(ctx)
    return {"instruction": ctx.choice([f"Call {c['name']}.", f"Please ring {c['name']} for me."]),
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), _tc("make_call", {"to": c["id"]}), _done(ctx, f"calling {c['name']}")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "call", "name": "call_started",
                                    "match": {"number": c["phone"], "direction": "out"}}]}}


@template("email.contact", "communication", "tool_use", 2)
def email_contact(ctx: Ctx) -> dict[str, Any]:
    c, _ = _pick_contact(ctx)
    subject, body = ctx.choice(POOLS["subject"]), ctx.choice(POOLS["body"])
    return {"instruction": f'Email {c["name"]} with the subject "{subject}" and the text "{body}"',
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), _tc("get_contact", {"id": c["id"]}),
                     _tc("send_email", {"to": c["email"], "subject": subject, "body": body}), _done(ctx, f"the email to {c['name']} is sent")],
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
            "gold": [search_step(ctx, ENTITY_BY_NAME["contact"], c["name"]), _tc("send_sms", {"to": c["id"], "body": body}),
                     _done(ctx, f"I texted your {role} {c['name']}")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "sms", "name": "text_sent",
                                    "match": {"to_number": c["phone"], "body": body, "direction": "out"}}]}}


def _saved_pair(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    places = [r for r in ctx.rows("saved_place") if describe(ctx, ENTITY_BY_NAME["saved_place"], r)]
    a, b = ctx.rng.sample(places, 2)
    return a, b


@template("route.between_saved", "navigation_rides", "tool_use", 2, weight=2)
def route_saved(ctx: Ctx) -> dict[str, Any]:
    a, b = _saved_pair(ctx)
    mode = ctx.choice(sorted(MODES))
    km = route_km(a["address"], b["address"])
    mins = max(1, round(km / MODES[mode] * 60))
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'How long does it take from my saved place "{a["name"]}" to "{b["name"]}" by {mode}?',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     _tc("get_route", {"origin": a["address"], "destination": b["address"], "mode": mode}),
                     msg(f"About {mins} minutes by {mode} ({km} km).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [mins]}}}


@template("rides.book_to_saved", "navigation_rides", "tool_use", 2, weight=2)
def ride_book(ctx: Ctx) -> dict[str, Any]:
    a, b = _saved_pair(ctx)
    kind = ctx.choice(["standard", "comfort", "xl"])
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'Book a {kind} ride from "{a["name"]}" to "{b["name"]}".',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     _tc("book_ride", {"pickup": a["address"], "dropoff": b["address"], "ride_type": kind}), _done(ctx, "your ride is booked")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "ride", "name": "ride_booked",
                                    "match": {"pickup": a["address"], "dropoff": b["address"], "ride_type": kind, "status": "booked"}}]}}


@template("rides.cancel", "navigation_rides", "tool_use", 2)
def ride_cancel(ctx: Ctx) -> dict[str, Any] | None:
    e = ENTITY_BY_NAME["ride"]
    ride = {"pickup": ctx.choice(POOLS["address"]), "dropoff": ctx.choice(POOLS["poi"]), "ride_type": "standard", "status": "booked", "fare": 18.5}
    rid = f"ride_{e.n + 1}"
    return {"initial_state": {"rows": {"ride": [ride]}},
            "instruction": f"Cancel my booked ride to {ride['dropoff']}.",
            "gold": [search_step(ctx, e, ride["dropoff"]), _tc("cancel_ride", {"id": rid}), _done(ctx, "the ride is cancelled")],
            "verifier": {"goals": [{"kind": "field", "entity": "ride", "id": rid, "values": {"status": "cancelled"}}]}}


@template("shop.buy_now", "shopping_food", "skills", 2, weight=2, family="buy_now")
def shop_buy(ctx: Ctx) -> dict[str, Any]:
    e = ENTITY_BY_NAME["product"]
    p = ctx.choice([r for r in ctx.rows(e) if sum(1 for x in ctx.rows(e) if x["name"] == r["name"]) == 1])
    q = ctx.choice([1, 2, 3])
    cart = ctx.rows("cart_item")
    return {"initial_state": {"delete": {"cart_item": [c["id"] for c in cart]}},
            "instruction": f"Order {q} x {p['name']} for me right now.",
            "gold": [search_step(ctx, e, p["name"]), _tc("create_cart_item", {"product_id": p["id"], "quantity": q}),
                     _tc("place_order", {}), _done(ctx, f"your order of {q} x {p['name']} is placed")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "order", "name": "ordered",
                                    "match": {"items": f"{p['name']} x{q}", "status": "processing"}}],
                         "allow": ["shop_cart_items"],
                         "milestones": [{"tool": "create_cart_item"}, {"tool": "place_order"}]}}


@template("bank.transfer", "payments_banking", "tool_use", 2, weight=2)
def transfer(ctx: Ctx) -> dict[str, Any] | None:
    payee = ctx.choice(ctx.rows("payee"))
    acct = max(ctx.rows("account"), key=lambda r: r["balance"])
    amt = ctx.choice([25, 40, 60, 120, 250])
    if acct["balance"] < amt:
        return None
    new = round(acct["balance"] - amt, 2)
    return {"instruction": f'Send {amt} USD from my "{acct["name"]}" account to {payee["name"]}.',
            "gold": [search_step(ctx, ENTITY_BY_NAME["payee"], payee["name"], group=1),
                     search_step(ctx, ENTITY_BY_NAME["account"], acct["name"], group=1),
                     _tc("transfer_money", {"from_account_id": acct["id"], "payee_id": payee["id"], "amount": amt}),
                     _done(ctx, f"{amt} USD sent to {payee['name']}")],
            "verifier": {"goals": [{"kind": "field", "entity": "account", "id": acct["id"], "values": {"balance": new}},
                                   {"kind": "new_row", "entity": "transaction", "name": "txn", "match": {"amount": -amt}}]}}


@template("bank.transfer_over_limit", "payments_banking", "tool_use", 3)
def transfer_refuse(ctx: Ctx) -> dict[str, Any]:
    payee = ctx.choice(ctx.rows("payee"))
    amt = ctx.choice([2500, 3000, 5000, 12000])
    return {"instruction": f"Transfer {amt} USD to {payee['name']}.",
            "gold": [msg("Sorry, I can't do that: transfers above 2000 USD aren't allowed from the phone. Please use online banking.",
                         why=f"{amt} USD is above the 2000 USD transfer limit, so I have to decline.")],
            "verifier": {"goals": [], "answer": {"kind": "refuse"},
                         "minefields": [{"kind": "call", "tool": "transfer_money", "name": "transfer_attempted"}]},
            "extra_tools": ["search_payees", "search_accounts", "transfer_money"]}


@template("wallet.pay_bill", "payments_banking", "tool_use", 2)
def pay_bill_t(ctx: Ctx) -> dict[str, Any] | None:
    bill = ctx.choice(ctx.rows("bill"))
    acct = max(ctx.rows("account"), key=lambda r: r["balance"])
    if acct["balance"] < bill["amount"] or describe(ctx, ENTITY_BY_NAME["bill"], bill) is None:
        return None
    return {"instruction": f'Pay my {bill["name"]} bill from "{acct["name"]}".',
            "gold": [search_step(ctx, ENTITY_BY_NAME["bill"], bill["name"], group=1),
                     search_step(ctx, ENTITY_BY_NAME["account"], acct["name"], group=1),
                     _tc("pay_bill", {"bill_id": bill["id"], "from_account_id": acct["id"]}), _done(ctx, f"the {bill['name']} bill is paid")],
            "verifier": {"goals": [{"kind": "field", "entity": "bill", "id": bill["id"], "values": {"paid": True}},
                                   {"kind": "field", "entity": "account", "id": acct["id"], "values": {"balance": round(acct["balance"] - bill["amount"], 2)}},
                                   {"kind": "new_row", "entity": "transaction", "name": "txn", "match": {"amount": -bill["amount"]}}]}}


@template("music.play", "media", "tool_use", 1, weight=2)
def play(ctx: Ctx) -> dict[str, Any]:
    e = ENTITY_BY_NAME["song"]
    s = ctx.choice([r for r in ctx.rows(e) if describe(ctx, e, r)])
    return {"instruction": f'Play "{s["title"]}" by {s["artist"]}.',
            "gold": [search_step(ctx, e, s["title"]), _tc("play_song", {"song_id": s["id"]}), _done(ctx, f"playing {s['title']}")],
            "verifier": {"goals": [{"kind": "device", "key": "now_playing", "value": s["id"]},
                                   {"kind": "device", "key": "playing", "value": True}]}}


@template("music.volume", "media", "tool_use", 1)
def volume(ctx: Ctx) -> dict[str, Any]:
    lvl = ctx.choice([10, 20, 35, 60, 80])
    return {"initial_state": {"device": {"media_volume": 50}}, "instruction": f"Set the media volume to {lvl}%.",
            "gold": [_tc("set_media_volume", {"level": lvl}), _done(ctx, f"media volume is {lvl}%")],
            "verifier": {"goals": [{"kind": "device", "key": "media_volume", "value": lvl}]}}


@template("device.toggle", "device_settings", "tool_use", 1, weight=3)
def toggle(ctx: Ctx) -> dict[str, Any]:
    key, label = ctx.choice([("wifi", "Wi-Fi"), ("bluetooth", "Bluetooth"), ("do_not_disturb", "do not disturb"),
                             ("dark_mode", "dark mode"), ("location_services", "location services"), ("flashlight", "the flashlight")])
    on = ctx.choice([True, False])
    state = {"device": {key: not on}}
    return {"initial_state": state, "instruction": f"Turn {'on' if on else 'off'} {label}.",
            "gold": [_tc(f"set_{key}", {"enabled": on}), _done(ctx, f"{label} is {'on' if on else 'off'}")],
            "verifier": {"goals": [{"kind": "device", "key": key, "value": on}]}}


@template("device.bluetooth_low_power", "device_settings", "tool_use", 3)
def bt_low_power(ctx: Ctx) -> dict[str, Any]:
    return {"initial_state": {"device": {"bluetooth": False, "low_power_mode": True}},
            "instruction": "Turn on Bluetooth.",
            "gold": [_tc("set_bluetooth", {"enabled": True}), _done(ctx, "Bluetooth is on (I had to turn off low power mode)")],
            "verifier": {"goals": [{"kind": "device", "key": "bluetooth", "value": True}], "allow": ["device.low_power_mode"]},
            "extra_tools": ["set_low_power_mode"]}


@template("device.level", "device_settings", "tool_use", 1)
def level(ctx: Ctx) -> dict[str, Any]:
    key, label = ctx.choice([("brightness", "screen brightness"), ("ringer_volume", "ringer volume")])
    lvl = ctx.choice([15, 30, 45, 75, 90])
    return {"initial_state": {"device": {key: 50}}, "instruction": f"Set the {label} to {lvl}%.",
            "gold": [_tc(f"set_{key}", {"level": lvl}), _done(ctx, f"{label} set to {lvl}%")],
            "verifier": {"goals": [{"kind": "device", "key": key, "value": lvl}]}}


@template("device.battery", "device_settings", "tool_use", 1)
def battery(ctx: Ctx) -> dict[str, Any]:
    b = ctx.choice([12, 23, 47, 64, 91])
    return {"initial_state": {"device": {"battery": b}}, "instruction": "How much battery do I have left?",
            "gold": [_tc("get_device_status", {}), msg(f"Your battery is at {b}%.")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [b]}}}


@template("skills.commute_brief", "navigation_rides", "skills", 2, family="commute_brief")
def commute_brief(ctx: Ctx) -> dict[str, Any]:
    a, b = _saved_pair(ctx)
    w = weather(ctx.persona.home_city, ctx.today.isoformat())
    km = route_km(a["address"], b["address"])
    mins = max(1, round(km / MODES["transit"] * 60))
    sp = ENTITY_BY_NAME["saved_place"]
    return {"instruction": f'Give me a commute brief: transit time from "{a["name"]}" to "{b["name"]}" and today\'s high in {ctx.persona.home_city}.',
            "gold": [search_step(ctx, sp, a["name"], group=1), search_step(ctx, sp, b["name"], group=1),
                     _tc("get_weather", {"city": ctx.persona.home_city}, group=2),
                     _tc("get_route", {"origin": a["address"], "destination": b["address"], "mode": "transit"}, group=2),
                     msg(f"Transit takes about {mins} minutes; today's high is {w['high_c']} C ({w['condition']}).")],
            "verifier": {"goals": [], "answer": {"kind": "answer", "contains": [mins, w["high_c"]]},
                         "milestones": [{"tool": "get_weather"}, {"tool": "get_route"}]}}


@template("sub.transfer_via_roles", "payments_banking", "subagent", 3)
def sub_transfer(ctx: Ctx) -> dict[str, Any] | None:
    out = transfer(ctx)
    if out is None:
        return None
    g = out["gold"]
    out["roles"] = {"planner": [], "banker": ["search_payees", "search_accounts", "transfer_money"]}
    out["gold"] = [delegate("banker", "Find the payee and account, then make the transfer."),
                   *[{k: v for k, v in dict(s, agent="banker").items() if k != "group"} for s in g[:3]], g[3]]
    out["verifier"]["milestones"] = [{"tool": "transfer_money", "agent": "banker"}]
    return out
