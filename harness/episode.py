"""The rules of one episode, whatever produces the planner's replies (no jax).

Every loop that runs a planner against an env follows the same rules, so they live here once:

- a reply that is not a well-formed turn (a tool call that does not parse, a cut or empty turn, a control
  token, invalid UTF-8) gets one error Feedback (`INVALID_ARGUMENTS` with the expected format as its hint),
  shown to the planner as a tool turn, and the episode goes on (until `max_output_errors` such turns, when
  that limit is set, or the turn limit);
- tool calls are stepped in order; an INFRA/TIMEOUT answer, or an env that raises, ends the episode as
  infra (the world's fault: never a reward);
- plain text is the answer: a `message` Action sent to the env, which ends the episode when the env takes
  it (a sub-agent's answer instead goes back to its caller);
- conversations (contract version 2): an env may take the message and answer with the user's next turn
  (`Feedback.user_turn`); it is shown to the planner as a user message and the episode goes on, until an
  answer carries no next turn (the conversation is over: finish reason "answer");
- `max_turns` replies per user turn end the episode (a single-request episode: `max_turns` replies).

`Episode` applies these rules to one `Reply` at a time. Three loops drive it: the token-level runner
(`mpa_jax.rollout.runner`, engine tokens in and out), `run_episode` below (chat-only planners: OpenAI
endpoints, scripted planners) and the harness's sub-agents (`harness.runtime`).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Step, Task, Trajectory, Verification
from mpa_jax.envs.render import action_to_message, feedback_to_message, tool_call_to_action

PARSE_HINT = (
    'Call a tool as <tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call> with a JSON object '
    "of arguments, or answer the user in plain text."
)
IM_END = "<|im_end|>"  # a token-level turn's raw text ends with it; the chat keeps the text without it


@dataclasses.dataclass
class Reply:
    """One planner turn as the rules see it.

    `calls` are {"name", "arguments"[, "id"]} dicts; `malformed` names why the turn is not a well-formed
    reply ("parse_error", "cut_turn", "control_token", "invalid_utf8") with `problem` the message shown to
    the planner; `infra` non-empty means the backend failed (the episode ends as infra).
    """

    content: str = ""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reasoning: str | None = None
    malformed: str = ""
    problem: str = ""
    infra: str = ""
    raw: str = ""


def call_id(turn: int, j: int) -> str:
    """The id of the j-th call of a turn (turns count from 1)."""
    return f"call_{turn}_{j}"


class Episode:
    """One episode's state under the rules of the module docstring.

    `step(action) -> Feedback` acts in the world (an env, a harness route, a pool); `act(reply)` applies one
    reply and returns (the assistant message to record, the feedback messages to show next). `ended` /
    `finish_reason` ("answer", "max_turns", "output_errors", "infra") say when and why it stopped; `infra`
    holds the reason of an infra end; `answer` a sub-agent's answer (`answer_to_env=False`).
    """

    def __init__(self, task: Task | None, step: Callable[[Action], Feedback], *, max_turns: int,
                 max_output_errors: int = 0, agent: str = "planner", answer_to_env: bool = True,
                 make_call_id: Callable[[int, int], str] = call_id) -> None:
        self.task, self._step, self.max_turns = task, step, int(max_turns)
        self.max_output_errors, self.agent, self.answer_to_env = int(max_output_errors), agent, answer_to_env
        self.make_call_id = make_call_id
        self.steps: list[Step] = []
        self.turns = self.tool_calls = self.parse_errors = 0
        self.user_turns = 0  # follow-up user turns the env sent (conversations)
        self._turn_start = 0  # `turns` when the current user turn began: the turn limit counts from there
        self.output_errors: collections.Counter = collections.Counter()
        self.finish_reason = ""
        self.infra = ""
        self.answer: str | None = None

    @property
    def ended(self) -> bool:
        return bool(self.finish_reason)

    def end(self, reason: str, infra: str = "") -> None:
        """Stop the episode (the first reason given wins)."""
        if not self.finish_reason:
            self.finish_reason = reason
        if infra and not self.infra:
            self.infra, self.finish_reason = infra, "infra"

    def act(self, reply: Reply) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Apply one reply (see the class docstring)."""
        if self.ended:
            raise RuntimeError("Episode.act after the episode ended")
        if reply.infra:
            self.end("infra", reply.infra)
            return None, []
        self.turns += 1
        if reply.malformed:
            return self._malformed(reply)
        if reply.calls:
            return self._calls(reply)
        return self._answer(reply)

    def _malformed(self, reply: Reply) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.output_errors[reply.malformed] += 1
        self.parse_errors += reply.malformed == "parse_error"
        name = str(reply.calls[0].get("name", "")) if reply.calls else ""
        fb = Feedback.error(ErrorCode.INVALID_ARGUMENTS, reply.problem, call_id=self.make_call_id(self.turns, 0), hint=PARSE_HINT)
        self.steps.append(Step(action=Action(kind="tool_call", name=name, raw=reply.raw, agent=self.agent), feedback=fb))
        if self.max_output_errors > 0 and sum(self.output_errors.values()) >= self.max_output_errors:
            self.end("output_errors")
        self._turn_limit()
        # what was produced is what the chat holds (not a parsed message)
        content = reply.raw[: -len(IM_END)] if reply.raw.endswith(IM_END) else reply.raw
        return {"role": "assistant", "content": content}, [feedback_to_message(fb)]

    def _calls(self, reply: Reply) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        # tool_call_to_action also maps a `delegate` call to a delegate Action (envs/render.py)
        actions = [tool_call_to_action({"function": {"name": c["name"], "arguments": dict(c.get("arguments") or {})},
                                        "id": c.get("id") or self.make_call_id(self.turns, j)}, raw=reply.raw, agent=self.agent)
                   for j, c in enumerate(reply.calls)]
        msg = action_to_message(actions)
        if reply.content and not msg.get("content"):
            msg["content"] = reply.content
        if reply.reasoning is not None and "reasoning_content" not in msg:
            msg["reasoning_content"] = reply.reasoning
        shown: list[dict[str, Any]] = []
        for action in actions:
            self.tool_calls += 1
            fb = self._act(action)
            if self.ended:
                return msg, shown
            shown.append(feedback_to_message(fb))
        self._turn_limit()
        return msg, shown

    def _answer(self, reply: Reply) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            msg["reasoning_content"] = reply.reasoning
        if not self.answer_to_env:
            self.answer = reply.content
            self.end("answer")
            return msg, []
        fb = self._act(Action.message(reply.content, raw=reply.raw, agent=self.agent))
        if self.ended:
            return msg, []
        if fb is not None and fb.ok and fb.user_turn:
            # the user speaks again: a user turn (mask 0 at the token level), with a fresh turn budget
            self.user_turns += 1
            self._turn_start = self.turns
            return msg, [{"role": "user", "content": fb.user_turn}]
        if fb is None or fb.ok:
            self.end("answer")
            return msg, []
        # the env refused the message (e.g. empty text): show the error and let the planner go on
        self._turn_limit()
        return msg, [feedback_to_message(fb)]

    def _act(self, action: Action) -> Feedback | None:
        """Step one action; an exception or an INFRA/TIMEOUT answer ends the episode as infra."""
        try:
            fb = self._step(action)
        except Exception as e:  # noqa: BLE001 - an env crash is the world's fault
            err = None if action.kind == "message" else Feedback.error(ErrorCode.INFRA, f"{type(e).__name__}: {e}", action.call_id)
            self.steps.append(Step(action=action, feedback=err))
            self.end("infra", f"env.step raised {type(e).__name__}: {e}")
            return err
        self.steps.append(Step(action=action, feedback=fb))
        if fb is not None and fb.is_infra:
            self.end("infra", f"env returned {ErrorCode(fb.error_code).value}: {fb.message}")
        return fb

    def _turn_limit(self) -> None:
        if not self.ended and self.turns - self._turn_start >= self.max_turns:
            self.end("max_turns")


def reply_from_planner(reply: Any) -> Reply:
    """A harness `PlannerReply` (text, calls, error Feedback) as a `Reply`."""
    if reply.error is not None and reply.error.is_infra:
        return Reply(infra=reply.error.message, raw=reply.raw or reply.text)
    if reply.error is not None:
        return Reply(malformed="parse_error", problem=reply.error.message, raw=reply.raw or reply.text)
    return Reply(content=reply.text, calls=[dict(c) for c in reply.calls], reasoning=reply.reasoning, raw=reply.raw or reply.text)


def run_episode(planner: Any, env: Any, task: Task, max_turns: int = 8, harness_version: str = "none") -> Trajectory:
    """One episode of a chat-only `planner` (`respond(messages, tools) -> PlannerReply`) on `env` (raw or a
    HarnessEnv). The Trajectory has no token ids; a planner that returns them has them kept per turn in
    provenance["turns"]. Never raises for a backend or env problem (see the module docstring)."""
    t0 = time.perf_counter()
    try:
        obs = env.reset(task)
    except Exception as e:  # noqa: BLE001
        return _traj(task, [], [], Verification(False, 0.0, infra_error=True), "infra", f"reset failed: {e}", {},
                     harness_version, t0, [])
    messages = [dict(m) for m in obs["messages"]]
    tools = obs.get("tools") or None
    ep = Episode(task, env.step, max_turns=max_turns)
    out_tokens = in_tokens = 0
    turns: list[dict[str, Any]] = []
    while not ep.ended:
        reply = planner.respond(messages, tools)
        out_tokens += reply.output_tokens
        in_tokens += reply.prompt_tokens
        if reply.token_ids:
            turns.append({"prompt_ids": reply.prompt_ids, "token_ids": reply.token_ids, "logprobs": reply.logprobs})
        msg, shown = ep.act(reply_from_planner(reply))
        if msg is not None:
            messages.append(msg)
        messages += shown
    verification = Verification(False, 0.0, infra_error=True)
    if not ep.infra:
        try:
            verification = env.verify()
        except Exception as e:  # noqa: BLE001
            ep.end("infra", f"verify raised {e}")
    costs = {"output_tokens": float(out_tokens), "input_tokens": float(in_tokens), "tool_calls": float(ep.tool_calls),
             "turns": float(ep.turns), "user_turns": float(ep.user_turns)}
    traj = _traj(task, ep.steps, messages, verification, ep.finish_reason, ep.infra, costs, harness_version, t0, turns,
                 ep.output_errors)
    traj.provenance["planner"] = getattr(planner, "name", type(planner).__name__)
    try:
        env.close()
    except Exception:  # noqa: BLE001
        pass
    return traj


def _traj(task: Task, steps: list[Step], messages: list[dict[str, Any]], v: Verification, finish: str, infra: str,
          costs: dict[str, float], harness_version: str, t0: float, turns: list[dict[str, Any]],
          output_errors: dict[str, int] | None = None) -> Trajectory:
    if infra:
        v = Verification(False, 0.0, infra_error=True)
    costs = dict(costs, wall_s=time.perf_counter() - t0)
    prov = {"task": task.id, "domain": task.domain, "category": task.category, "template": task.template,
            "split": task.split, "harness_version": harness_version, "infra_reason": infra}
    if output_errors is not None:
        prov["output_errors"] = dict(sorted(output_errors.items()))
    if turns:
        prov["turns"] = turns
    return Trajectory(task_id=task.id, tokens=[], loss_mask=[], logprobs=[], steps=list(steps), verification=v,
                      costs=costs, provenance=prov, messages=messages, finish_reason=finish, infra_failure=bool(infra))


def oracle_trajectory(env: Any, task: Task, seed: int = 0, harness_version: str = "none", reasoning: str = "full") -> Trajectory:
    """The scripted oracle on `env` (raw or harness-wrapped) as a text-level Trajectory."""
    from mpa_jax.envs.oracle import run_oracle_episode

    t0 = time.perf_counter()
    try:
        ep = run_oracle_episode(env, task, seed=seed, reasoning=reasoning)
    finally:
        try:
            env.close()
        except Exception:  # noqa: BLE001
            pass
    costs = {"tool_calls": float(sum(1 for s in ep.steps if s.action.kind == "tool_call")),
             "user_turns": float(sum(1 for s in ep.steps if s.feedback is not None and s.feedback.user_turn))}
    traj = _traj(task, ep.steps, ep.messages, ep.verification, "answer", "", costs, harness_version, t0, [])
    traj.provenance["planner"] = "oracle"
    return traj


def feedback_summary(fb: Feedback | None) -> str:
    if fb is None:
        return "-"
    return "ok" if fb.ok else f"{getattr(fb.error_code, 'value', fb.error_code)}: {fb.message}"
