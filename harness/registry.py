"""One tool registry over several sources: the env's ToolSpecs, MCP servers, memory and anything else
that implements the small provider interface:

    class ToolProvider(Protocol):
        source: str                                   # "sandbox", "mcp:<server>", "memory", ...
        def specs(self) -> list[ToolSpec]: ...
        def call(self, name: str, args: dict) -> Feedback: ...   # never raises for a bad call

The registry knows every tool's schema (for validation and normalisation) and which provider serves
it. Env tools are special only in that the runtime executes them through `env.step` (the env's ledger,
allow-lists and agent attribution stay the source of truth); their provider serves the catalog specs.

A provider may also name tools it has but refuses (`refused()`: an MCP server's tools off the
allow-list). Such a name is `in` the registry and routed to its provider, whose call answers
PERMISSION_DENIED (not UNKNOWN_TOOL: the tool exists, the planner may not use it); it is never listed
(`names`, `specs`, `describe`) and never clashes: a tool another source serves wins the name.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Protocol, runtime_checkable

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec
from mpa_jax.envs.schema import SchemaError, compile_schema


@runtime_checkable
class ToolProvider(Protocol):
    source: str

    def specs(self) -> list[ToolSpec]:
        ...

    def call(self, name: str, args: dict[str, Any]) -> Feedback:
        ...


class RegistryError(ValueError):
    """Two sources register one tool name, or a spec is unusable; the message names the tool."""


class SandboxTools:
    """The sandbox catalog as a provider. `call` runs the tool in a fresh sandbox world (the CLI's
    `mpa harness call`); inside an episode the runtime calls `env.step` instead."""

    source = "sandbox"

    def __init__(self, persona_seed: int = 0) -> None:
        self.persona_seed = persona_seed
        self._env: Any = None

    def specs(self) -> list[ToolSpec]:
        from mpa_jax.envs.tools import TOOLS

        return [t.spec for t in TOOLS.values()]

    def call(self, name: str, args: dict[str, Any]) -> Feedback:
        from mpa_jax.envs.sandbox import SandboxEnv

        if self._env is None:
            self._env = SandboxEnv(fault_injection=False)
        task = Task(id="harness-call", domain="utilities", category="tool_use", difficulty=1, instruction="",
                    tools=[name], verifier={}, gold=[], persona_seed=self.persona_seed)
        self._env.reset(task)
        return self._env.step(Action.tool_call(name, args, call_id="call_0"))

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class ToolRegistry:
    """Tool name -> (spec, provider, compiled validator)."""

    def __init__(self, providers: Iterable[ToolProvider] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._source: dict[str, ToolProvider] = {}
        self._validators: dict[str, Any] = {}
        self._refused: dict[str, ToolProvider] = {}  # refused tool name -> its provider
        self.providers: list[ToolProvider] = []
        for p in providers:
            self.add_provider(p)

    def add_provider(self, provider: ToolProvider) -> None:
        """Register every tool of `provider`; a name already served by another source is an error."""
        specs = provider.specs()
        for spec in specs:
            if spec.name in self._specs and self._source[spec.name] is not provider:
                fix = (" (give the server's harness.mcp entry a prefix=... or rename=OLD:NEW)"
                       if provider.source.startswith("mcp:") or self._source[spec.name].source.startswith("mcp:") else "")
                raise RegistryError(f"tool {spec.name!r} of {provider.source} is already registered by"
                                    f" {self._source[spec.name].source}{fix}")
        for spec in specs:
            self._specs[spec.name] = spec
            self._source[spec.name] = provider
            self._validators.pop(spec.name, None)
            self._refused.pop(spec.name, None)
        refused = getattr(provider, "refused", None)
        for name in refused() if callable(refused) else ():
            if name not in self._specs:
                self._refused.setdefault(name, provider)
        self.providers.append(provider)

    def names(self) -> list[str]:
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        """True for every tool a provider answers, refused ones included (their calls: PERMISSION_DENIED)."""
        return name in self._specs or name in self._refused

    def is_refused(self, name: str) -> bool:
        """True for a tool its provider has but refuses (an MCP tool off the allow-list)."""
        return name in self._refused and name not in self._specs

    def spec(self, name: str) -> ToolSpec:
        if name not in self._specs and name in self._refused:
            # the router normalises before it calls: any schema does, the call is refused whatever the arguments
            return ToolSpec(name=name, app=self._refused[name].source, domain="utilities", description=name,
                            parameters={"type": "object"})
        return self._specs[name]

    def provider(self, name: str) -> ToolProvider:
        return self._source[name] if name in self._source else self._refused[name]

    def source(self, name: str) -> str:
        return self.provider(name).source

    def specs(self, source: str | None = None) -> list[ToolSpec]:
        return [s for n, s in self._specs.items() if source is None or self._source[n].source == source]

    def validate(self, name: str, args: Any) -> str:
        """'' when `args` fit the tool's schema, else the validator's message ('' for a refused tool: its
        call is refused whatever the arguments, and permission is checked first)."""
        if self.is_refused(name):
            return ""
        v = self._validators.get(name)
        if v is None:
            try:
                v = compile_schema(self._specs[name].parameters)
            except Exception:  # noqa: BLE001 - a foreign (MCP) schema outside the strict subset is not checked here
                v = lambda _a: None  # noqa: E731
            self._validators[name] = v
        try:
            v(args)
        except SchemaError as e:
            return str(e)
        return ""

    def suggest(self, name: str, among: Iterable[str] | None = None, n: int = 3) -> list[str]:
        """Close tool names for an unknown one (typos, wrong plural)."""
        pool = list(among) if among is not None else self.names()
        return difflib.get_close_matches(str(name), pool, n=n, cutoff=0.6)

    def describe(self) -> list[dict[str, Any]]:
        """The registry as JSON rows: name, description, JSON schema, source."""
        return [{"name": s.name, "description": s.description, "parameters": s.parameters, "source": self._source[n].source}
                for n, s in self._specs.items()]

    def close(self) -> None:
        for p in self.providers:
            close = getattr(p, "close", None)
            if close is not None:
                close()


def unknown_tool_feedback(name: str, call_id: str, suggestions: list[str]) -> Feedback:
    hint = ("did you mean " + " or ".join(suggestions) + "?") if suggestions else "call one of the tools listed"
    return Feedback.error(ErrorCode.UNKNOWN_TOOL, f"unknown tool {name!r}", call_id, hint)
