"""The tool registry and what every tool module shares: Tool, ToolError, TOOLS, the `handler` decorator, schemas.

A tool is a ToolSpec plus an executor `fn(world, args) -> result` that raises `ToolError` for typed
failures; `register` compiles its parameter schema into a validator (schema.py). Modules register their
tools at import, and `envs/tools/__init__.py` imports them in a fixed order: the order of TOOLS is part of
the benchmark (distractor sampling, catalog listings), pinned by tests/unit/test_envs_fingerprint.py.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Callable

from mpa_jax.envs.catalog import Entity
from mpa_jax.envs.contract import ErrorCode, ToolSpec
from mpa_jax.envs.schema import compile_schema
from mpa_jax.envs.world import World


class ToolError(Exception):
    """A typed tool failure; becomes an error Feedback."""

    def __init__(self, code: ErrorCode, message: str, hint: str = "", result: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.hint, self.result = code, message, hint, result


@dataclasses.dataclass
class Tool:
    """A registered tool: its spec, executor, compiled validator, preconditions and (table tools) entity and op."""
    spec: ToolSpec
    run: Callable[[World, dict[str, Any]], Any]
    validate: Callable[[Any], None]
    preconditions: tuple[str, ...]
    entity: Entity | None = None
    op: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind


TOOLS: dict[str, Tool] = {}


def register(spec: ToolSpec, run: Callable, entity: Entity | None = None, op: str = "") -> None:
    """Add a tool to TOOLS (its parameter schema compiled to a validator); a name may be registered once."""
    if spec.name in TOOLS:
        raise ValueError(f"duplicate tool {spec.name}")
    TOOLS[spec.name] = Tool(spec, run, compile_schema(spec.parameters), tuple(spec.preconditions), entity, op)


def object_schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A strict parameters object: exactly `props`, `required` among them."""
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def id_schema(e: Entity) -> dict[str, Any]:
    """The parameter schema of a row id of `e` (`<entity>_<n>`)."""
    return {"type": "string", "pattern": f"^{e.name}_[0-9]+$", "description": f"id of the {e.label} (e.g. {e.name}_3)"}


NETWORK = ("network",)
STR = {"type": "string", "minLength": 1, "maxLength": 500}
BOOL = {"type": "boolean"}
LEVEL = {"type": "integer", "minimum": 0, "maximum": 100}
CITY = {"type": "string", "minLength": 1, "maxLength": 60}


def not_found(e: Entity, rid: str) -> ToolError:
    """The NOT_FOUND error for a missing row of `e`, pointing at its search tool."""
    return ToolError(ErrorCode.NOT_FOUND, f"no {e.label} with id {rid}", hint=f"use search_{e.plural} to find valid ids")


def handler(name: str, app: str, domain: str, kind: str, description: str, params: dict[str, Any],
            required: list[str], pre: tuple[str, ...] = (), errors: tuple[str, ...] = ()):
    """Decorator registering a hand-written executor as tool `name` (INVALID_ARGUMENTS is always a possible error)."""
    def wrap(fn: Callable) -> Callable:
        register(ToolSpec(name=name, app=app, domain=domain, kind=kind, description=description,  # type: ignore[arg-type]
                          parameters=object_schema(params, required), preconditions=list(pre),
                          errors=["INVALID_ARGUMENTS", *errors]), fn)
        return fn
    return wrap


def device_now(world: World) -> dt.datetime:
    """The device clock of `world`."""
    return dt.datetime.fromisoformat(world.device["now"])


# The sub-agent hand-off is not a registered tool: the sandbox routes it itself (sandbox.py).
DELEGATE_SPEC = ToolSpec(
    name="delegate", app="harness", domain="utilities", kind="read",
    description="Hand a sub-task to a sub-agent role; its tool calls follow until you delegate again or answer the user.",
    parameters=object_schema({"agent": {"type": "string", "minLength": 1, "maxLength": 40, "description": "sub-agent role"},
                              "instruction": {"type": "string", "minLength": 1, "maxLength": 1000}}, ["agent", "instruction"]),
)
