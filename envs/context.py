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

The format is a process setting taken from the config (`context.configure(config)`), because envs are
built by factories far from the config (`make_env("sandbox")`); `MPA_CONTEXT` / `MPA_REASONING` set it
for processes that never see a config.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from mpa_jax.envs.contract import ToolSpec

FORMATS = ("json", "compact")
REASONING = ("full", "none")

_state: dict[str, str] = {}


def configure(config: Any) -> None:
    """Set the process' context format and demonstration reasoning from `config.context` (absent: defaults)."""
    section = config.get("context", None) if hasattr(config, "get") else None
    fmt = str(section.get("format", "json")) if section is not None else "json"
    reasoning = str(section.get("reasoning", "full")) if section is not None else "full"
    set_format(fmt, reasoning)


def set_format(fmt: str, reasoning: str = "full") -> None:
    """Set the context format ("json" | "compact") and demonstration reasoning ("full" | "none")."""
    if fmt not in FORMATS:
        raise ValueError(f"config.context.format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if reasoning not in REASONING:
        raise ValueError(f"config.context.reasoning must be one of {', '.join(REASONING)}, got {reasoning!r}")
    _state["format"] = fmt
    _state["reasoning"] = reasoning


def current_format() -> str:
    """The context format in force: set_format's, else $MPA_CONTEXT, else "json"."""
    fmt = _state.get("format") or os.environ.get("MPA_CONTEXT", "json")
    if fmt not in FORMATS:
        raise ValueError(f"MPA_CONTEXT must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def current_reasoning() -> str:
    """Demonstration reasoning in force: set_format's, else $MPA_REASONING, else "full"."""
    r = _state.get("reasoning") or os.environ.get("MPA_REASONING", "full")
    if r not in REASONING:
        raise ValueError(f"MPA_REASONING must be one of {', '.join(REASONING)}, got {r!r}")
    return r


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
