"""The planner's first view of a task: system prompt, prior history, the user's instruction, tool schemas.

Planner-visible only: persona facts a phone assistant would know (user name, city, the frozen clock),
memory history turns, and the instruction. Never the gold, the verifier, faults or hidden state.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from mpa_jax.envs import context
from mpa_jax.envs.contract import Task, ToolSpec
from mpa_jax.envs.tools import TRANSFER_LIMIT
from mpa_jax.envs.world import Persona


def system_prompt(task: Task, persona: Persona, fmt: str = "json") -> str:
    """The system text; "compact" keeps only the task-specific facts (the generic guidance is constant text
    a model trained from scratch learns nothing from)."""
    now = dt.datetime.fromisoformat(persona.now if "now" not in task.initial_state.get("device", {})
                                    else task.initial_state["device"]["now"])
    if fmt == "compact":
        lines = [f"Assistant of {persona.user_name} ({persona.home_city}). Now: {now:%A, %Y-%m-%d %H:%M}."
                 f" Transfers above {TRANSFER_LIMIT:.0f} USD are not allowed."]
        if task.roles:
            roles = "; ".join(f"{r}: {', '.join(sorted(t))}" for r, t in sorted(task.roles.items()) if r != "planner")
            lines.append(f"Delegate to sub-agents: {roles}.")
        return "\n".join(lines)
    lines = [
        f"You are the phone assistant of {persona.user_name}, who lives in {persona.home_city}.",
        f"Current date and time: {now:%A, %Y-%m-%d %H:%M}.",
        "Use the tools to act on the phone. Look up ids with the search tools before using them.",
        "When a tool returns an error, read it and recover (retry, fix the setting it names, or use another tool).",
        "Finish with one message to the user: the answer or a short confirmation. If information is missing or"
        " a request is ambiguous, ask a question instead of guessing. If a request is not allowed, decline and say why.",
        f"Money transfers above {TRANSFER_LIMIT:.0f} USD are not allowed from the phone.",
    ]
    if task.roles:
        roles = "; ".join(f"{r}: {', '.join(sorted(t))}" for r, t in sorted(task.roles.items()) if r != "planner")
        lines.append("You coordinate sub-agents and cannot call their tools yourself. Use `delegate` to hand a role its part;"
                     f" tool calls after a delegation act as that role. Roles and their tools: {roles}.")
    return "\n".join(lines)


def observation(task: Task, persona: Persona, specs: list[ToolSpec], fmt: str = "json") -> dict[str, Any]:
    """{"messages": [system, *history, user], "tools": [openai function dicts]}.

    `fmt` is the context format (`envs.context`): "compact" puts one-line tool signatures in the system
    message and returns no tools (the chat template then renders no schemas).
    """
    system = system_prompt(task, persona, fmt)
    if fmt == "compact":
        system += "\n" + context.compact_tools(specs)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in task.history:
        messages.append({"role": turn["role"], "content": turn["content"]})
    messages.append({"role": "user", "content": task.instruction})
    return {"messages": messages, "tools": [] if fmt == "compact" else [s.to_openai() for s in specs]}
