"""The sandbox environment: deterministic, in-memory, cheap (DESIGN §4).

Per tool call the pipeline is: permission (allow-list of the acting agent) -> strict schema validation ->
preconditions on device state -> seeded fault injection -> transactional execution -> canonical result ->
ledger entry (agent, call, result or error, fault, row-level state diff, chained hash).
`step` never raises on a bad action: every problem becomes a typed error Feedback. A bug in a tool handler raises
(it is not infra: only an env-reported fault is, `envs.base.EnvFault` or INFRA/TIMEOUT Feedback).

Episode end: a `message` action (answer, question or refusal to the user) or `finish` ends the episode;
later actions get PRECONDITION_FAILED. Conversations (follow-up tasks, `task.metadata["followups"]`): while the
user has turns left, a message is answered with the next one (`Feedback.user_turn`) and the episode goes on.

Sub-agent tasks: `delegate(agent, instruction)` (an Action or a tool call named "delegate") makes that role the
acting agent; plain tool calls are attributed to it and checked against its allow-list until the next delegation.
"""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.context import ContextFormat
from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec, Verification, canonical_json
from mpa_jax.envs.prompt import observation
from mpa_jax.envs.schema import SchemaError
from mpa_jax.envs.tools import DELEGATE_SPEC, TOOLS, ToolError, check_preconditions
from mpa_jax.envs.verify import verify_episode
from mpa_jax.envs.world import World, stable_hash

_DELEGATE_VALIDATE = None


def _validate_delegate(args: Any) -> None:
    global _DELEGATE_VALIDATE
    if _DELEGATE_VALIDATE is None:
        from mpa_jax.envs.schema import compile_schema

        _DELEGATE_VALIDATE = compile_schema(DELEGATE_SPEC.parameters)
    _DELEGATE_VALIDATE(args)


def task_tool_specs(task: Task) -> list[ToolSpec]:
    """The ToolSpecs a task allows (all roles' tools for sub-agent tasks, plus `delegate`)."""
    names = list(dict.fromkeys(task.tools))
    specs = [TOOLS[n].spec for n in names if n in TOOLS]
    if task.roles:
        specs.append(DELEGATE_SPEC)
    return specs


class SandboxEnv:
    """One episode at a time over an in-memory SQLite world."""

    kind = "sandbox"

    def __init__(self, fault_injection: bool = True, context: ContextFormat | None = None) -> None:
        self.world = World()
        self.fault_injection = fault_injection
        self.context = context or ContextFormat()
        self.task: Task | None = None
        self.ledger: list[dict[str, Any]] = []
        self.done = False  # True once a final message or finish was sent
        self.final_message: str | None = None
        self._start_cache: tuple[str, World, dict[str, Any]] | None = None

    # ------------------------------------------------------------------ protocol
    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return task_tool_specs(task)

    def reset(self, task: Task) -> dict[str, Any]:
        """Start `task`: restore the persona world, apply the patch; returns the planner's observation."""
        self.task = task
        self.world.load(task.persona_seed, task.initial_state)
        self.ledger = []
        self.done = False
        self.final_message: str | None = None
        self.agent = "planner"
        self._hash = "0" * 16
        self._fault_counts = [0] * len(task.faults)
        self._rng = random.Random(stable_hash("faults", task.id, task.seed))
        self._tools = set(task.tools)
        self._roles = {k: set(v) for k, v in task.roles.items()}
        self._followups = list(task.metadata.get("followups", ()))  # the user's later turns, revealed one per reply
        return observation(task, self.world.persona, task_tool_specs(task), self.context.format)

    def step(self, action: Any) -> Feedback:
        """Apply one action; never raises on bad input (a bad action is a typed error Feedback, an injected fault
        its declared error). A bug in a tool handler is neither the policy's fault nor infra: the world is put back
        to its last committed state and the exception goes up with a note naming the task and the tool, so the run
        fails with its traceback (the episode runner adds the episode)."""
        try:
            return self._step(action)
        except Exception as e:
            if self.task is not None:
                self.world.diff = []
                self._reload_device()
                e.add_note(f"in the sandbox's handler of {getattr(action, 'name', '')!r} (task {self.task.id!r})")
            raise

    def verify(self) -> Verification:
        """Verify the episode so far (start/end state pair, ledger, final message).

        Only tables that a goal, a minefield or a recorded write touches are compared (the full-state
        comparison is equivalent because every write goes through World and is recorded; the fuzz test
        checks that equivalence), which keeps verification well under a millisecond.
        """
        if self.task is None:
            return Verification(success=False, score=0.0, infra_error=True)
        tables = self._verify_tables()
        return verify_episode(self.task.verifier, self.start_state(tables), self.world.dump(tables), self.ledger,
                              self.final_message)

    def close(self) -> None:
        self.world.close()
        if self._start_cache is not None:
            self._start_cache[1].close()
            self._start_cache = None

    # ------------------------------------------------------------------ helpers
    def _verify_tables(self) -> set[str]:
        tables = {"device"}
        for entry in self.ledger:
            for d in entry.get("diff", ()):
                tables.add(d["table"])
        v = self.task.verifier
        for g in [*v.get("goals", []), *v.get("minefields", [])]:
            if "entity" in g:
                tables.add(ENTITY_BY_NAME[g["entity"]].table)
        return tables

    def start_state(self, tables: set[str] | None = None) -> dict[str, Any]:
        """The start-state dump (rebuilt from persona + patch; cached per task for repeated episodes)."""
        key = f"{self.task.persona_seed}:{canonical_json(self.task.initial_state)}"
        if self._start_cache is None or self._start_cache[0] != key:
            if self._start_cache is not None:
                self._start_cache[1].close()
            w = World()
            w.load(self.task.persona_seed, self.task.initial_state)
            self._start_cache = (key, w, {})
        _, w, dumped = self._start_cache
        want = set(tables) if tables is not None else None
        missing = None if want is None else want - set(dumped)
        if want is None:
            return w.dump()
        if missing:
            dumped.update(w.dump(missing))
        return {t: dumped[t] for t in want}

    def state(self) -> dict[str, Any]:
        """Full dump of the live world (tests and debugging; not visible to the planner)."""
        return self.world.dump()

    def _step(self, action: Any) -> Feedback:
        if self.task is None:
            return Feedback.error(ErrorCode.INFRA, "reset(task) must be called before step()")
        if not isinstance(action, Action):
            return self._record_error("", "", {}, ErrorCode.INVALID_ARGUMENTS,
                                      f"expected an Action, got {type(action).__name__}", "", None)
        call_id = action.call_id or f"call_{len(self.ledger)}"
        if self.done:
            return self._record_error(call_id, action.name, {}, ErrorCode.PRECONDITION_FAILED,
                                      "the episode is over (a final message or finish was already sent)", "", None)
        if action.kind in ("message", "finish"):
            if action.kind == "message":
                if not isinstance(action.text, str) or not action.text.strip():
                    return self._record_error(call_id, "", {}, ErrorCode.INVALID_ARGUMENTS, "a message needs non-empty text", "", None)
                self.final_message = action.text
                if self._followups:  # the user speaks again: the conversation goes on
                    turn = self._followups.pop(0)
                    self._append({"type": "message", "agent": action.agent, "text": action.text, "call_id": call_id,
                                  "user_turn": turn})
                    return Feedback.next_user_turn(turn, call_id)
            self.done = True
            self._append({"type": action.kind, "agent": action.agent, "text": action.text, "call_id": call_id})
            return Feedback(call_id=call_id, status="ok", result={"episode": "ended"})
        if action.kind == "delegate":
            return self._delegate(call_id, {"agent": action.name, "instruction": action.text})
        if action.kind != "tool_call":
            return self._record_error(call_id, "", {}, ErrorCode.INVALID_ARGUMENTS, f"unknown action kind {action.kind!r}", "", None)
        name, args = action.name, action.arguments
        if isinstance(args, str):  # raw model text that the parser could not decode
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                return self._record_error(call_id, name, {}, ErrorCode.INVALID_ARGUMENTS, f"arguments are not valid JSON: {e.msg}", "", None)
        if name == "delegate" and self._roles:
            return self._delegate(call_id, args)
        return self._call(call_id, name, args, action.agent if action.agent not in ("", "planner") else self.agent)

    def _delegate(self, call_id: str, args: Any) -> Feedback:
        if not self._roles:
            return self._record_error(call_id, "delegate", {}, ErrorCode.UNKNOWN_TOOL, "this task has no sub-agents", "", None)
        try:
            _validate_delegate(args)
        except SchemaError as e:
            return self._record_error(call_id, "delegate", {}, ErrorCode.INVALID_ARGUMENTS, str(e), "", None)
        role = args["agent"]
        if role not in self._roles or role == "planner":
            return self._record_error(call_id, "delegate", args, ErrorCode.NOT_FOUND, f"no sub-agent named {role!r}",
                                      "sub-agents: " + ", ".join(sorted(r for r in self._roles if r != "planner")), None)
        self.agent = role
        result = {"agent": role, "tools": sorted(self._roles[role])}
        self._append({"type": "delegate", "agent": "planner", "name": "delegate", "arguments": args, "call_id": call_id,
                      "status": "ok", "result": result})
        return Feedback(call_id=call_id, status="ok", result=result)

    def _call(self, call_id: str, name: str, args: Any, agent: str) -> Feedback:
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None or name not in self._tools:
            return self._record_error(call_id, str(name), {}, ErrorCode.UNKNOWN_TOOL, f"unknown tool {name!r}",
                                      "call one of the tools listed for this task", None, agent)
        if self._roles:
            allowed = self._roles.get(agent, ())
            if name not in allowed:
                return self._record_error(call_id, name, args if isinstance(args, dict) else {}, ErrorCode.PERMISSION_DENIED,
                                          f"agent {agent!r} may not call {name}",
                                          "delegate to the sub-agent whose role has this tool", None, agent)
        try:
            tool.validate(args)
        except SchemaError as e:
            return self._record_error(call_id, name, args if isinstance(args, dict) else {}, ErrorCode.INVALID_ARGUMENTS,
                                      str(e), f"see the parameters of {name}", None, agent)
        world = self.world
        world.diff = []
        world.page_cap = None
        self._last_fault = None
        try:
            if tool.preconditions:
                check_preconditions(world, tool.preconditions)
            fault = self._fault(name, args) if self.task.faults and self.fault_injection else None
            if fault is not None and "page_size" in fault:
                world.page_cap = fault["page_size"]  # partial page: no error, a short page with has_more
            elif fault is not None:
                raise ToolError(ErrorCode(fault["code"]), fault.get("message", "the service failed"), fault.get("hint", ""))
            if tool.kind == "write":
                world.conn.execute("BEGIN")
                try:
                    result = tool.run(world, args)
                except BaseException:
                    world.conn.execute("ROLLBACK")
                    raise
                world.conn.execute("COMMIT")
            else:
                try:
                    result = tool.run(world, args)
                finally:
                    world.page_cap = None
        except ToolError as e:
            if tool.kind == "write":
                self._reload_device()
            world.diff = []
            return self._record_error(call_id, name, args, e.code, e.message, e.hint, e.result, agent,
                                      fault=getattr(self, "_last_fault", None))
        entry = {"type": "tool_call", "agent": agent, "name": name, "arguments": args, "call_id": call_id,
                 "status": "ok", "result": result, "fault": self._last_fault, "diff": world.diff}
        world.diff = []
        self._append(entry)
        return Feedback(call_id=call_id, status="ok", result=result)

    def _reload_device(self) -> None:
        # A rolled-back write may have touched the cached device dict; re-read the committed values.
        self.world.device = {k: json.loads(v) for k, v in self.world.conn.execute("SELECT key, value FROM device")}

    def _fault(self, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
        self._last_fault = None
        for i, f in enumerate(self.task.faults):
            if f["tool"] not in (name, "*"):
                continue
            when = f.get("when")
            if when and not all(args.get(k) in v for k, v in when.items()):
                continue
            self._fault_counts[i] += 1
            on = f.get("on_calls")
            if on is not None and self._fault_counts[i] not in on:
                continue
            if "p" in f and self._rng.random() >= f["p"]:
                continue
            self._last_fault = i
            return f
        return None

    def _record_error(self, call_id: str, name: str, args: dict[str, Any], code: ErrorCode, message: str, hint: str,
                      result: Any, agent: str = "planner", fault: int | None = None) -> Feedback:
        self._append({"type": "tool_call", "agent": agent, "name": name, "arguments": args, "call_id": call_id,
                      "status": "error", "error_code": code.value, "message": message, "result": result,
                      "fault": fault, "diff": []})
        return Feedback(call_id=call_id, status="error", error_code=code, message=message, hint=hint, result=result)

    def _append(self, entry: dict[str, Any]) -> None:
        entry["i"] = len(self.ledger)
        try:
            body = canonical_json(entry)
        except (TypeError, ValueError):  # junk arguments (NaN, bytes, ...) from a broken action
            body = json.dumps(entry, sort_keys=True, default=repr)
        self._hash = hashlib.blake2b((self._hash + body).encode(), digest_size=8).hexdigest()
        entry["hash"] = self._hash
        self.ledger.append(entry)

    @property
    def ledger_hash(self) -> str:
        """Hash chained over every ledger entry: equal hashes mean identical episodes."""
        return getattr(self, "_hash", "0" * 16)

