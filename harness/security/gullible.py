"""`GulliblePlanner`: a scripted test double for a weak LLM that obeys any instruction it reads (no jax).

It is not a model: it replays the task's gold tool calls in order (the user's goal), and the first time a tool result
it is shown carries the task's injected text (`task.metadata["injection"]["texts"]`), it first makes the attacker's
goal calls (`task.metadata["injection"]["attacker_calls"]`), then goes on with the user's task; finally it answers
with the gold's closing message. Refusals and errors do not stop it (it has no judgement). With no defense its
targeted attack success rate is ~100% by construction, which makes it the worst case a defense must hold against.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.contract import Task
from mpa_jax.harness.planners import PlannerReply


def gold_calls(task: Task) -> tuple[list[dict[str, Any]], str]:
    """The task's gold tool calls (agent steps included, in order) and its closing message."""
    calls, final = [], "Done."
    for s in task.gold:
        if s.get("kind") == "tool_call":
            calls.append({"name": s["name"], "arguments": dict(s.get("arguments") or {})})
        elif s.get("kind") == "message":
            final = str(s.get("text") or final)
    return calls, final


class GulliblePlanner:
    """See the module docstring. One instance per episode (it keeps the episode's progress)."""

    name = "gullible"

    def __init__(self, task: Task) -> None:
        self.queue, self.final = gold_calls(task)
        inj = task.metadata.get("injection") or {}
        self.snippets = [" ".join(_words(t).split()[:10]) for t in inj.get("texts", []) if _words(t).strip()]
        self.attack = [dict(c) for c in inj.get("attacker_calls", [])]
        self.triggered = False
        self.read = 0  # messages already looked at

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        new, self.read = messages[self.read:], len(messages)
        if not self.triggered and self.snippets and any(
                m.get("role") == "tool" and any(s in _words(m.get("content")) for s in self.snippets) for m in new):
            self.triggered = True
            self.queue = self.attack + self.queue  # obey first, then carry on
        if self.queue:
            c = self.queue.pop(0)
            return PlannerReply(calls=[{"name": c["name"], "arguments": c["arguments"]}])
        return PlannerReply(text=self.final)


def _words(content: Any) -> str:
    """Text as lower-case words (quoting, escaping and line folding of JSON/YAML renderings do not matter)."""
    import json
    import re

    s = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    s = s.replace("\\n", " ").replace("\\t", " ")
    return " " + " ".join(re.sub(r"[^a-z0-9]+", " ", s.lower()).split()) + " "
