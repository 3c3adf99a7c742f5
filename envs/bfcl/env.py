"""`BfclEnv`: BFCL v4 multi-turn through the env contract, on BFCL's own backends and checker (no jax).

One episode is one BFCL entry, a conversation: `reset` shows the first user turn; tool calls run on the
entry's backend instances (GorillaFileSystem, TradingBot, ...); the planner's text reply closes the user
turn and the env answers with the next one (`Feedback.user_turn`) until the last; `verify` runs BFCL's
`multi_turn_checker` over the calls of every turn (a state check and a response check after each turn) and
keeps its error type in the Verification's check. A conversation cut short (turn or token limit) fails as
BFCL's `multi_turn:force_terminated`. miss_func: at the turn where BFCL gives the held-back tool back, the
user turn carries its doc (BFCL's prompting form, since rendered tools do not change mid-episode). As in
BFCL, a call is executed when its name is any tool of the entry's classes (a held-back one included).

The traps of BFCL's code, handled here:
- `execute_multi_turn_func_call` keeps backend instances in its module's globals, keyed by model name and
  entry id: each episode and each check uses a unique name, and `close`/`verify` delete those globals;
- it `eval()`s call strings: a call is recorded only when its name is a tool of the entry's classes, its argument keys are
  the tool's parameters and its values are JSON data (`repr` of JSON data is a Python literal);
- BFCL_PROJECT_ROOT is set to a scratch folder (`project_root`) before bfcl_eval is imported.
"""
from __future__ import annotations

import copy
import json
import sys
import uuid
from typing import Any

from mpa_jax.envs.bfcl import data
from mpa_jax.envs.context import ContextFormat, compact_tools
from mpa_jax.envs.contract import Action, Check, ErrorCode, Feedback, Task, ToolSpec, Verification

SYSTEM_PROMPT = ("You are a helpful assistant with tools. Call the tools to do what the user asks, one request at a "
                 "time; when a request is done, or cannot be done with the tools and details you have, reply to the "
                 "user in plain text.")
_UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
_JSON_SCALARS = (str, int, float, bool, type(None))


def _is_json_data(v: Any) -> bool:
    if isinstance(v, _JSON_SCALARS):
        return not (isinstance(v, float) and v != v)  # NaN has no literal
    if isinstance(v, list):
        return all(_is_json_data(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_json_data(x) for k, x in v.items())
    return False


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """The call as BFCL's handlers record it: `name(k=repr(v), ...)`."""
    return f"{name}(" + ",".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"


def forget_instances(name: str) -> None:
    """Delete the backend instances BFCL cached under model name `name` (and its `_eval` / ground-truth twins)."""
    import re

    mod = sys.modules.get(_UTILS)
    if mod is None:
        return
    prefix = re.sub(r"[-./:]", "_", name)
    for key in [k for k in vars(mod) if k.startswith(prefix)]:
        del vars(mod)[key]


class BfclEnv:
    """BFCL v4 multi-turn (module docstring). Options from `config.envs.bfcl` (split keys: `data.make_tasks`)."""

    kind = "bfcl"

    def __init__(self, project_root: str = "", split_seed: int = 0, test_scenarios: int = 40, dev_scenarios: int = 20,
                 context: ContextFormat | None = None) -> None:
        data.set_project_root(project_root)
        data.package_dir()  # a clear error now when bfcl-eval is missing
        self.split_seed, self.test_scenarios, self.dev_scenarios = int(split_seed), int(test_scenarios), int(dev_scenarios)
        self.context = context or ContextFormat()
        self.task: Task | None = None
        self._name = ""

    # ------------------------------------------------------------------ tasks
    def tasks(self, split: str) -> list[Task]:
        """The tasks of a split (scenario-disjoint; see `envs.bfcl.data`)."""
        return data.make_tasks(split, split_seed=self.split_seed, test_scenarios=self.test_scenarios,
                               dev_scenarios=self.dev_scenarios)

    def tool_specs(self, task: Task) -> list[ToolSpec]:
        offered, _ = data.functions(data.entry(task.metadata["bfcl_id"]))
        return [data.tool_spec(c, d) for c, d in offered]

    # ------------------------------------------------------------------ one episode
    def reset(self, task: Task) -> dict[str, Any]:
        """Start the conversation: fresh backend instances from the entry's initial config; the first user turn."""
        self.close()
        self.task = task
        self.entry = data.entry(task.metadata["bfcl_id"])
        self.category = data.category_of(self.entry["id"])
        offered, self.held = data.functions(self.entry)
        # a call is checked against every doc of the entry's classes: BFCL executes a held-back tool's call too
        # (one ground truth, miss_func_49, calls `tail` a turn before it is given back); the held-back tool is only
        # shown from its turn on
        self.known = {d["name"]: (c, d) for c in self.entry["involved_classes"] for d in data.class_docs(c)}
        self.turn = 0
        self.calls: list[list[list[str]]] = [[] for _ in self.entry["question"]]  # per turn, per step: call strings
        self.replies: list[str] = []
        self._name = f"mpa_{uuid.uuid4().hex}"
        self._execute([])  # build the instances now: a backend that fails to load fails the reset
        specs = [data.tool_spec(c, d) for c, d in offered]
        system = SYSTEM_PROMPT
        if self.context.format == "compact":
            system += "\n" + compact_tools(specs)
        return {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": data.user_text(self.entry["question"][0])}],
                "tools": [] if self.context.format == "compact" else [s.to_openai() for s in specs]}

    def _execute(self, calls: list[str]) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

        results, _ = execute_multi_turn_func_call(calls, self.entry["initial_config"], self.entry["involved_classes"],
                                                  self._name, self.entry["id"], long_context=self.category == "long_context",
                                                  is_evaL_run=False)
        return results

    def step(self, action: Any) -> Feedback:
        """A tool call runs on the backends; a text reply closes the user turn (the next one comes back)."""
        if self.task is None:
            return Feedback.error(ErrorCode.PRECONDITION_FAILED, "reset the env first", getattr(action, "call_id", ""))
        if not isinstance(action, Action):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"not an Action: {type(action).__name__}")
        if self.turn >= len(self.entry["question"]):
            return Feedback.error(ErrorCode.PRECONDITION_FAILED, "the conversation is over", action.call_id)
        if action.kind in ("message", "finish"):
            return self._reply(action)
        if action.kind != "tool_call":
            return Feedback.error(ErrorCode.UNKNOWN_TOOL, f"{action.kind} is not available here", action.call_id)
        problem = self._invalid(action)
        if problem is not None:
            return problem
        call = call_string(action.name, action.arguments)
        self.calls[self.turn].append([call])
        (result,) = self._execute([call])
        return self._feedback(action.call_id, result)

    def _invalid(self, action: Action) -> Feedback | None:
        """Why a call may not be recorded (BFCL eval()s recorded calls), or None."""
        if action.name not in self.known:
            return Feedback.error(ErrorCode.UNKNOWN_TOOL, f"no tool named {action.name!r}", action.call_id,
                                  "call one of the tools you were given")
        args = action.arguments
        if not isinstance(args, dict):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "arguments must be a JSON object", action.call_id)
        params = self.known[action.name][1]["parameters"]
        props, required = params.get("properties", {}), params.get("required", [])
        unknown = [k for k in args if k not in props]
        if unknown:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"{action.name} has no parameter {unknown[0]!r}", action.call_id,
                                  f"parameters: {', '.join(props) or 'none'}")
        missing = [k for k in required if k not in args]
        if missing:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"{action.name} needs {missing[0]!r}", action.call_id)
        bad = next((k for k, v in args.items() if not _is_json_data(v)), None)
        if bad is not None:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"argument {bad!r} is not JSON data", action.call_id)
        return None

    @staticmethod
    def _feedback(call_id: str, result: str) -> Feedback:
        if result.startswith("Error during execution:"):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, result, call_id)
        try:
            value: Any = json.loads(result)
        except (json.JSONDecodeError, TypeError):
            value = result
        if isinstance(value, dict) and "error" in value:  # the backend refused (e.g. no such file): BFCL's own words
            return Feedback(call_id=call_id, status="error", error_code=ErrorCode.PRECONDITION_FAILED,
                            message=str(value["error"]), result=value)
        return Feedback(call_id=call_id, status="ok", result=value)

    def _reply(self, action: Action) -> Feedback:
        self.replies.append(action.text)
        self.turn += 1
        if self.turn >= len(self.entry["question"]):
            return Feedback(call_id=action.call_id, status="ok")
        text = data.user_text(self.entry["question"][self.turn])
        added = self.held.get(self.turn, [])
        if added:
            docs = json.dumps([data.tool_spec(c, d).to_openai() for c, d in added], ensure_ascii=False)
            text = (docs + "\n" + data.ADDED_TOOLS_PROMPT) if not text else f"{docs}\n{data.ADDED_TOOLS_PROMPT}\n{text}"
        return Feedback.next_user_turn(text, action.call_id, result={"tools_added": [d["name"] for _, d in added]})

    def verify(self) -> Verification:
        """BFCL's `multi_turn_checker` over every turn's calls; its error type is the failed check's detail."""
        if self.task is None:
            raise RuntimeError("verify before reset")
        n = len(self.entry["question"])
        if self.turn < n:  # BFCL fails an entry whose turns were not all answered, before any check
            detail = f"multi_turn:force_terminated: {self.turn} of {n} user turns answered"
            return Verification(success=False, score=0.0, checks=[Check("bfcl_multi_turn_checker", False, detail)])
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        name = f"mpa_check_{uuid.uuid4().hex}"
        try:
            result = multi_turn_checker(copy.deepcopy(self.calls), self.entry["ground_truth"], copy.deepcopy(self.entry),
                                        f"multi_turn_{self.category}", name)
        finally:
            forget_instances(name)
        ok = bool(result.get("valid"))
        detail = "" if ok else f"{result.get('error_type', '?')}: {result.get('error_message', '')}"
        return Verification(success=ok, score=float(ok), checks=[Check("bfcl_multi_turn_checker", ok, detail)])

    def close(self) -> None:
        if self._name:
            forget_instances(self._name)
            self._name = ""
