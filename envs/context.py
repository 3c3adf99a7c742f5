"""The planner's context format: how tools and the system prompt are shown to the model (no jax).

Two formats, one place, used by the env's observation (hence rollouts) and by oracle demonstrations
(hence SFT data), so that the model trains on exactly what it later sees:

- "json" (default; what real Qwen checkpoints expect): the tool specs go to the chat template as
  OpenAI function dicts, which renders them as JSON schemas (~900 of ~1,300 tokens per episode).
- "compact" (small models trained from scratch): one line per tool, `name(arg, opt?, mode?: a|b)`,
  written into the system message; the chat template then gets no `tools`, so the Qwen3 template itself
  is unchanged (parity with real checkpoints holds in both formats).

Demonstration reasoning is a second knob: "full" (the oracle's `<think>` sentences) or "none" (no
reasoning text: the tokens carry nothing the next action does not already say).

A `ContextFormat` is a value passed explicitly: `ContextFormat.from_config(config)` -> env constructors
(`make_env(kind, config=...)` passes it), the oracle (`reasoning=`), the episode runner and the collector.
There is no process-wide setting.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from mpa_jax.envs.contract import ToolSpec

FORMATS = ("json", "compact")
REASONING = ("full", "none")


@dataclasses.dataclass(frozen=True)
class ContextFormat:
    """How tools are shown (`format`: json | compact) and whether demonstrations carry reasoning (full | none)."""

    format: str = "json"
    reasoning: str = "full"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"config.context.format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.reasoning not in REASONING:
            raise ValueError(f"config.context.reasoning must be one of {', '.join(REASONING)}, got {self.reasoning!r}")

    @classmethod
    def from_config(cls, config: Any) -> "ContextFormat":
        """From `config.context` (format, reasoning)."""
        return cls(str(config.context.format), str(config.context.reasoning))

    def to_dict(self) -> dict[str, str]:
        return {"format": self.format, "reasoning": self.reasoning}


def _param(name: str, schema: dict[str, Any], required: bool) -> str:
    text = name if required else name + "?"
    enum = schema.get("enum")
    if enum:
        return f"{text}: {'|'.join(str(v) for v in enum)}"
    typ = schema.get("type")
    # strings are the default and carry no information; other types are worth their token or two
    if typ and typ != "string":
        return f"{text}: {typ if isinstance(typ, str) else '|'.join(typ)}"
    return text


def tool_signature(spec: ToolSpec) -> str:
    """One line: `name(required, optional?, enum: a|b, count: integer)`; required parameters first."""
    props = spec.parameters.get("properties", {})
    req = list(spec.parameters.get("required", []))
    order = [p for p in req if p in props] + [p for p in props if p not in req]
    return f"{spec.name}({', '.join(_param(p, props[p], p in req) for p in order)})"


def compact_tools(specs: Iterable[ToolSpec]) -> str:
    """The system-message block listing the tools, one signature per line."""
    return "Tools:\n" + "\n".join(tool_signature(s) for s in specs)
