"""Table tools generated from the catalog: search / get / create / update / delete for every entity.

Which operations an entity has comes from its `ops` in `catalog.ENTITIES`; the SQL runs on the world's
SQLite database. Online entities need the network (a precondition the sandbox checks).
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITIES, ENTITY_BY_NAME, Entity, Field
from mpa_jax.envs.contract import ErrorCode, ToolSpec
from mpa_jax.envs.tools.base import NETWORK, ToolError, id_schema, not_found, object_schema, register
from mpa_jax.envs.world import CONVERTERS, World, parse_id


def _field_schema(f: Field) -> dict[str, Any]:
    d: dict[str, Any] = {"description": f.words}
    if f.ref:
        d.update(type="string", pattern=f"^{f.ref}_[0-9]+$", description=f"id of the {ENTITY_BY_NAME[f.ref].label}")
    elif f.type == "int":
        d["type"] = "integer"
    elif f.type == "num":
        d["type"] = "number"
    elif f.type == "bool":
        d["type"] = "boolean"
    elif f.type == "enum":
        d.update(type="string", enum=list(f.enum))
    elif f.type == "date":
        d.update(type="string", pattern=r"^\d{4}-\d{2}-\d{2}$", description=f"{f.words} (YYYY-MM-DD)")
    elif f.type == "time":
        d.update(type="string", pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description=f"{f.words} (HH:MM, 24h)")
    else:
        d.update(type="string", minLength=1, maxLength=500)
    if f.lo is not None:
        d["minimum"] = f.lo
    if f.hi is not None:
        d["maximum"] = f.hi
    return d


def _pre(e: Entity) -> list[str]:
    return list(NETWORK) if e.online else []


def _build_entity_tools(e: Entity) -> None:
    app_title = e.app.capitalize()
    conv = CONVERTERS[e.name]
    cols = ", ".join(f.name for f in e.fields)
    if "s" in e.ops:
        where = " OR ".join(f"lower({f}) LIKE ?" for f in e.search)
        summary_sql = f"SELECT n, {', '.join(e.summary)} FROM {e.table} WHERE {where} ORDER BY n LIMIT ? OFFSET ?"
        k = len(e.search)
        summary = e.summary
        prefix = e.name + "_"

        def search(world: World, args: dict[str, Any], sql=summary_sql, k=k, summary=summary, prefix=prefix) -> Any:
            q = "%" + args["query"].strip().lower() + "%"
            take = args.get("limit", 10)
            if world.page_cap is not None:  # a partial-page fault: the service returns a short page
                take = min(take, world.page_cap)
            off = args.get("offset", 0)
            rows = world.conn.execute(sql, (q,) * k + (take + 1, off)).fetchall()
            out: dict[str, Any] = {"results": [{"id": prefix + str(r[0]), **dict(zip(summary, r[1:]))} for r in rows[:take]],
                                   "count": min(len(rows), take)}
            if len(rows) > take:
                out["has_more"] = True
                out["next_offset"] = off + take
            return out

        register(ToolSpec(
            name=f"search_{e.plural}", app=e.app, domain=e.domain, kind="read", preconditions=_pre(e),
            description=f"{app_title} app: search {e.label}s by text (matches {', '.join(f.replace('_', ' ') for f in e.search)}); returns ids and summaries, one page at a time.",
            parameters=object_schema({"query": {"type": "string", "minLength": 1, "maxLength": 100, "description": "text to look for"},
                             "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "max results (default 10)"},
                             "offset": {"type": "integer", "minimum": 0, "maximum": 10000, "description": "skip this many results (for the next page)"}},
                            ["query"]),
            returns={"type": "object", "properties": {"results": {"type": "array"}, "count": {"type": "integer"},
                                                      "has_more": {"type": "boolean"}, "next_offset": {"type": "integer"}}},
            errors=["INVALID_ARGUMENTS", "PRECONDITION_FAILED"] if e.online else ["INVALID_ARGUMENTS"],
        ), search, e, "search")
    if "g" in e.ops:
        get_sql = f"SELECT n, {cols} FROM {e.table} WHERE n = ?"

        def get(world: World, args: dict[str, Any], sql=get_sql, e=e, conv=conv) -> Any:
            row = world.conn.execute(sql, (parse_id(e, args["id"]),)).fetchone()
            if row is None:
                raise not_found(e, args["id"])
            return conv(row)

        register(ToolSpec(
            name=f"get_{e.name}", app=e.app, domain=e.domain, kind="read", preconditions=_pre(e),
            description=f"{app_title} app: get every detail of one {e.label} by id.",
            parameters=object_schema({"id": id_schema(e)}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), get, e, "get")
    writable = [f for f in e.fields if not f.derived]
    if "c" in e.ops:

        def create(world: World, args: dict[str, Any], e=e) -> Any:
            row = dict(args)
            for f in e.fields:
                if f.ref:
                    ref_e = ENTITY_BY_NAME[f.ref]
                    ref_row = world.get(ref_e, parse_id(ref_e, args[f.name]))
                    if ref_row is None:
                        raise not_found(ref_e, args[f.name])
                elif f.derived:
                    src, col = f.derive
                    ref_e = ENTITY_BY_NAME[e.field(src).ref]
                    row[f.name] = world.get(ref_e, parse_id(ref_e, args[src]))[col]
            rid = world.insert(e, row)
            return {"id": rid, "created": world.get(e, parse_id(e, rid))}

        register(ToolSpec(
            name=f"create_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: create a new {e.label}.",
            parameters=object_schema({f.name: _field_schema(f) for f in writable}, [f.name for f in writable if f.req]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), create, e, "create")
    updatable = [f for f in writable if f.updatable]
    if "u" in e.ops:

        def update(world: World, args: dict[str, Any], e=e) -> Any:
            changes = {k: v for k, v in args.items() if k != "id"}
            if not changes:
                raise ToolError(ErrorCode.INVALID_ARGUMENTS, "nothing to update: pass at least one field besides id")
            n = parse_id(e, args["id"])
            if world.get(e, n) is None:
                raise not_found(e, args["id"])
            return {"updated": world.update(e, n, changes)}

        register(ToolSpec(
            name=f"update_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: change fields of an existing {e.label}; only the fields given change.",
            parameters=object_schema({"id": id_schema(e), **{f.name: _field_schema(f) for f in updatable}}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), update, e, "update")
    if "d" in e.ops:

        def delete(world: World, args: dict[str, Any], e=e) -> Any:
            n = parse_id(e, args["id"])
            if world.get(e, n) is None:
                raise not_found(e, args["id"])
            world.delete(e, n)
            return {"deleted": args["id"]}

        register(ToolSpec(
            name=f"delete_{e.name}", app=e.app, domain=e.domain, kind="write", preconditions=_pre(e),
            description=f"{app_title} app: delete a {e.label} by id.",
            parameters=object_schema({"id": id_schema(e)}, ["id"]),
            errors=["INVALID_ARGUMENTS", "NOT_FOUND"],
        ), delete, e, "delete")


for _e in ENTITIES:
    _build_entity_tools(_e)
