"""SimulatedEnv: the env protocol (reset / step / verify / close) over the simulated apps.

A tool call is validated against its ToolSpec, then answered from the reply cache or by the backend (the
prompt holds the spec, the task, the app's rows and the ledger); a reply that is invalid is retried
`max_retries` times, after which the call is INFRA and so is the rest of the episode. A valid reply's delta is
applied to the store and the reply becomes the call's Feedback. Simulated tasks are training-only: `reset`
refuses tasks of the dev/test splits.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.context import ContextFormat, compact_tools
from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec, Verification, canonical_json
from mpa_jax.envs.schema import SchemaError
from mpa_jax.envs.simulated.backends import BACKENDS, Backend
from mpa_jax.envs.simulated.catalog import SIM_TOOLS, SimTool
from mpa_jax.envs.simulated.protocol import InvalidReply, check_reply, parse_reply, simulator_prompt
from mpa_jax.envs.simulated.scoring import score
from mpa_jax.envs.simulated.store import SimCache, SimState


class SimulatedEnv:
    """The env protocol over simulated apps. `backend` is a callable or a name in BACKENDS."""

    kind = "simulated"

    def __init__(self, backend: Backend | str = "deterministic", max_retries: int = 2, cache: SimCache | None = None,
                 context: ContextFormat | None = None) -> None:
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ValueError(f"config.envs.simulated.backend: unknown simulator backend {backend!r} "
                             f"(known: {', '.join(sorted(BACKENDS))})")
        self.backend: Backend = BACKENDS[backend]() if isinstance(backend, str) else backend
        self.context = context or ContextFormat()
        self.max_retries = int(max_retries)
        self.cache = cache if cache is not None else SimCache()
        self.state = SimState()
        self.task: Task | None = None
        self.ledger: list[dict[str, Any]] = []
        self.final_message: str | None = None
        self.infra = ""
        self.backend_calls = self.invalid_replies = 0

    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return [SIM_TOOLS[n].spec for n in task.tools if n in SIM_TOOLS]

    def reset(self, task: Task) -> dict[str, Any]:
        if task.split != "train" or task.metadata.get("env") != "simulated":
            raise ValueError(f"task {task.id}: simulated envs run simulated training tasks only (split {task.split!r});"
                             " the benchmark never scores simulated episodes")
        self.task, self.ledger, self.final_message, self.infra = task, [], None, ""
        self.state.load(task.metadata.get("sim_state", {}))
        system = ("You are a phone assistant with access to the user's connected apps. Use the tools to act;"
                  " finish with one short message to the user.")
        specs = self.tool_specs(task)
        if self.context.format == "compact":  # as the sandbox does: one-line signatures in the system message
            return {"messages": [{"role": "system", "content": system + "\n" + compact_tools(specs)},
                                 {"role": "user", "content": task.instruction}], "tools": []}
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}],
                "tools": [s.to_openai() for s in specs]}

    def step(self, action: Any) -> Feedback:
        call_id = getattr(action, "call_id", "") or f"call_{len(self.ledger)}"
        if self.task is None:
            return Feedback.error(ErrorCode.INFRA, "reset(task) must be called before step()", call_id)
        if self.infra:
            return Feedback.error(ErrorCode.INFRA, f"episode abandoned: {self.infra}", call_id)
        if not isinstance(action, Action):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"expected an Action, got {type(action).__name__}", call_id)
        if action.kind in ("message", "finish"):
            if action.kind == "message":
                if not str(action.text).strip():
                    return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "a message needs non-empty text", call_id)
                self.final_message = action.text
            self.ledger.append({"type": action.kind, "text": action.text, "call_id": call_id})
            return Feedback(call_id=call_id, status="ok", result={"episode": "ended"})
        tool = SIM_TOOLS.get(action.name)
        if action.kind != "tool_call" or tool is None or action.name not in self.task.tools:
            return self._error(call_id, action, ErrorCode.UNKNOWN_TOOL, f"unknown tool {action.name!r}")
        try:
            tool.validate(action.arguments)
        except SchemaError as e:
            return self._error(call_id, action, ErrorCode.INVALID_ARGUMENTS, str(e))
        return self._simulate(call_id, tool, action.arguments)

    def _error(self, call_id: str, action: Action, code: ErrorCode, message: str) -> Feedback:
        self.ledger.append({"type": "tool_call", "name": action.name, "arguments": action.arguments, "call_id": call_id,
                            "status": "error", "error_code": code.value, "message": message, "diff": []})
        return Feedback.error(code, message, call_id)

    def _simulate(self, call_id: str, tool: SimTool, args: dict[str, Any]) -> Feedback:
        key = (tool.spec.name, canonical_json(args), self.state.state_hash())
        reply = self.cache.get(key)
        problem = ""
        if reply is None:
            prompt = simulator_prompt(tool, args, self.task, self.state, self.ledger)
            for _attempt in range(1 + self.max_retries):
                self.backend_calls += 1
                try:
                    reply = check_reply(tool, args, parse_reply(self.backend(prompt)), self.state)
                    break
                except InvalidReply as e:
                    problem, reply = str(e), None
                except Exception as e:  # noqa: BLE001 - a backend failure (HTTP, engine) is retried, then INFRA
                    problem, reply = f"backend failed: {type(e).__name__}: {e}", None
                self.invalid_replies += 1
            if reply is None:
                self.infra = f"simulator gave no valid reply in {1 + self.max_retries} attempts: {problem}"
                return Feedback.error(ErrorCode.INFRA, self.infra, call_id)
            self.cache.put(key, reply)
        diffs = self.state.apply(reply["delta"])
        ok = reply["status"] == "ok"
        entry = {"type": "tool_call", "name": tool.spec.name, "arguments": args, "call_id": call_id,
                 "status": reply["status"], "result": reply.get("result"), "diff": diffs}
        self.ledger.append(entry)
        if ok:
            return Feedback(call_id=call_id, status="ok", result=reply.get("result"))
        return Feedback.error(ErrorCode(reply.get("error_code", "NOT_FOUND")), reply.get("message", ""), call_id)

    def verify(self) -> Verification:
        """The task's scoring rule over the end state; an infra episode (or none) scores as infra."""
        if self.task is None or self.infra:
            return Verification(success=False, score=0.0, infra_error=True)
        return score(self.task, self.state.dump(), self.final_message)

    def close(self) -> None:
        self.state.close()
