"""The rules of one episode, the planner protocol and the one chat-level episode driver (no jax).

Every loop that runs a planner against an env follows the same rules, so they live here once:

- a reply that is not a well-formed turn (a tool call that does not parse, a cut or empty turn, a control
  token, invalid UTF-8) gets one error Feedback (`INVALID_ARGUMENTS` with the expected format as its hint),
  shown to the planner as a tool turn, and the episode goes on (until `max_output_errors` such turns, when
  that limit is set, or the turn limit);
- tool calls are stepped in order; an INFRA/TIMEOUT answer, or an env that raises `envs.base.EnvFault`,
  ends the episode as infra (the world's fault: never a reward). Any other exception is a bug: it is
  raised, with a note naming the episode's task (never turned into infra, which RL would silently drop);
- plain text is the answer: a `message` Action sent to the env, which ends the episode when the env takes
  it (its Step then has no Feedback, as the contract says; a sub-agent's answer instead goes back to its
  caller);
- conversations (contract version 2): an env may take the message and answer with the user's next turn
  (`Feedback.user_turn`); it is shown to the planner as a user message and the episode goes on, until an
  answer carries no next turn (the conversation is over: finish reason "answer");
- `max_turns` replies per user turn end the episode (a single-request episode: `max_turns` replies);
- a planner with nothing more to say (`PlannerReply.stop`: a scripted plan that ran out) ends it
  ("planner_stop").

`Episode` applies these rules to one `Reply` at a time. Two loops drive it: the token-level runner
(`mpa_jax.rollout.runner`, engine tokens in and out) and `drive` below, the chat-level driver every
`Planner` (`respond(messages, tools) -> PlannerReply`) runs through: the scripted oracle (`envs.oracle`),
the teacher and any OpenAI-compatible endpoint, engine and scripted planners (`harness.planners`) and the
harness's sub-agents (`harness.runtime`). `run_chat_episode` is one whole episode: reset, drive, verify.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Protocol

from mpa_jax.envs.base import EnvFault, EnvUnavailable
from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Step, Task, Trajectory, Verification
from mpa_jax.envs.render import action_to_message, feedback_to_message, tool_call_to_action

PARSE_HINT = (
    'Call a tool as <tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call> with a JSON object '
    "of arguments, or answer the user in plain text."
)
IM_END = "<|im_end|>"  # a token-level turn's raw text ends with it; the chat keeps the text without it


@dataclasses.dataclass
class PlannerReply:
    """One planner turn: text and/or tool calls ({"name", "arguments"[, "id", "agent"]}), or an error Feedback
    (TIMEOUT/INFRA: the backend failed; INVALID_ARGUMENTS: a tool call that does not parse), or `stop`
    (nothing more to say). Engine-backed planners keep the sampled ids and log-probs."""

    text: str = ""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reasoning: str | None = None
    error: Feedback | None = None
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    raw: str = ""
    stop: bool = False

    @property
    def infra(self) -> bool:
        return self.error is not None and self.error.is_infra


class Planner(Protocol):
    """What the chat-level driver asks for a reply: the chat so far and the tool schemas (None: no tools)."""

    name: str

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        ...


@dataclasses.dataclass
class Reply:
    """One planner turn as the rules see it.

    `calls` are {"name", "arguments"[, "id", "agent"]} dicts; `malformed` names why the turn is not a
    well-formed reply ("parse_error", "cut_turn", "control_token", "invalid_utf8") with `problem` the message
    shown to the planner; `infra` non-empty means the backend failed (the episode ends as infra); `stop`
    that the planner has nothing more to say.
    """

    content: str = ""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reasoning: str | None = None
    malformed: str = ""
    problem: str = ""
    infra: str = ""
    raw: str = ""
    stop: bool = False


def call_id(turn: int, j: int) -> str:
    """The id of the j-th call of a turn (turns count from 1)."""
    return f"call_{turn}_{j}"


class Episode:
    """One episode's state under the rules of the module docstring.

    `step(action) -> Feedback` acts in the world (an env, a harness route, a pool); `act(reply)` applies one
    reply and returns (the assistant message to record, the feedback messages to show next). `ended` /
    `finish_reason` ("answer", "max_turns", "output_errors", "infra", "planner_stop") say when and why it
    stopped; `infra` holds the reason of an infra end; `answer` a sub-agent's answer (`answer_to_env=False`).
    """

    def __init__(self, task: Task | None, step: Callable[[Action], Feedback], *, max_turns: int,
                 max_output_errors: int = 0, agent: str = "planner", answer_to_env: bool = True,
                 make_call_id: Callable[[int, int], str] = call_id) -> None:
        if int(max_turns) < 1:
            raise ValueError(f"Episode: max_turns must be >= 1, got {max_turns}")
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
        if reply.stop:
            self.end("planner_stop")
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
        # tool_call_to_action also maps a `delegate` call to a delegate Action (envs/render.py); a call may name
        # the agent that acts (the oracle's demonstrations of a sub-agent's calls)
        actions = [tool_call_to_action({"function": {"name": c["name"], "arguments": dict(c.get("arguments") or {})},
                                        "id": c.get("id") or self.make_call_id(self.turns, j)}, raw=reply.raw,
                                       agent=str(c.get("agent") or self.agent))
                   for j, c in enumerate(reply.calls)]
        msg = action_to_message(actions, reasoning=reply.reasoning)
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
            self.steps[-1] = Step(action=self.steps[-1].action, feedback=None)  # a final message has no Feedback
            self.end("answer")
            return msg, []
        # the env refused the message (e.g. empty text): show the error and let the planner go on
        self._turn_limit()
        return msg, [feedback_to_message(fb)]

    def _act(self, action: Action) -> Feedback | None:
        """Step one action; an `EnvFault` or an INFRA/TIMEOUT answer ends the episode as infra."""
        try:
            fb = self._step(action)
        except EnvFault as e:  # the env says the world failed; any other exception is a bug and goes up
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


def reply_from_planner(reply: PlannerReply) -> Reply:
    """A `PlannerReply` (text, calls, error Feedback, stop) as the rules' `Reply`."""
    if reply.error is not None and reply.error.is_infra:
        return Reply(infra=reply.error.message, raw=reply.raw or reply.text)
    if reply.error is not None:
        return Reply(malformed="parse_error", problem=reply.error.message, raw=reply.raw or reply.text)
    # `raw` is the text an action was parsed from: none for a planner that gives structured replies (the oracle)
    return Reply(content=reply.text, calls=[dict(c) for c in reply.calls], reasoning=reply.reasoning, raw=reply.raw,
                 stop=reply.stop)


def drive(planner: Planner, episode: Episode, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
          on_reply: Callable[[PlannerReply], None] | None = None) -> None:
    """Ask `planner` for replies and apply them under `episode`'s rules until it ends; `messages` (the chat)
    grows in place with each assistant message and what the planner is shown next. `on_reply` sees every
    reply first (token counts, traces)."""
    while not episode.ended:
        reply = planner.respond(messages, tools)
        if on_reply is not None:
            on_reply(reply)
        msg, shown = episode.act(reply_from_planner(reply))
        if msg is not None:
            messages.append(msg)
        messages += shown


@dataclasses.dataclass
class ChatEpisode:
    """One chat-level episode: the chat (observation messages first), the tool schemas, the Action/Feedback
    steps, the verdict, why it ended, and per-turn token ids where the planner returned them."""

    task: Task
    planner: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    steps: list[Step]
    verification: Verification
    finish_reason: str
    infra: str = ""
    costs: dict[str, float] = dataclasses.field(default_factory=dict)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    output_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    ledger_hash: str = ""

    @property
    def task_id(self) -> str:
        return self.task.id

    def trajectory(self, harness_version: str = "none") -> Trajectory:
        """A text-level Trajectory (no token ids: a planner's own ids, if any, are in provenance["turns"])."""
        t = self.task
        prov: dict[str, Any] = {"task": t.id, "domain": t.domain, "category": t.category, "template": t.template,
                                "split": t.split, "harness_version": harness_version, "infra_reason": self.infra,
                                "output_errors": dict(sorted(self.output_errors.items())), "planner": self.planner}
        if self.turns:
            prov["turns"] = self.turns
        return Trajectory(task_id=t.id, tokens=[], loss_mask=[], logprobs=[], steps=list(self.steps),
                          verification=self.verification, costs=dict(self.costs), provenance=prov,
                          messages=list(self.messages), finish_reason=self.finish_reason, infra_failure=bool(self.infra))


def run_chat_episode(planner: Planner, env: Any, task: Task, *, max_turns: int, max_output_errors: int = 0) -> ChatEpisode:
    """One episode of `planner` on `env` (raw or a HarnessEnv): reset, `drive`, verify. The caller owns `env`
    (it is not closed). An `EnvFault` at reset, step or verify makes an infra episode; `EnvUnavailable` at
    reset is raised (every later episode would fail the same way); any other exception is raised with a
    note naming the task."""
    name = str(getattr(planner, "name", type(planner).__name__))
    t0 = time.perf_counter()
    try:
        return _run(planner, name, env, task, max_turns, max_output_errors, t0)
    except EnvUnavailable:
        raise
    except Exception as e:
        e.add_note(f"in the episode of task {task.id!r} (planner {name!r})")
        raise


def _run(planner: Planner, name: str, env: Any, task: Task, max_turns: int, max_output_errors: int, t0: float) -> ChatEpisode:
    infra_v = Verification(success=False, score=0.0, infra_error=True)
    try:
        obs = env.reset(task)
    except EnvUnavailable:
        raise
    except EnvFault as e:
        return ChatEpisode(task, name, [], [], [], infra_v, "infra", f"reset failed: {type(e).__name__}: {e}",
                           {"wall_s": time.perf_counter() - t0})
    messages = [dict(m) for m in obs["messages"]]
    tools = list(obs.get("tools") or [])
    ep = Episode(task, env.step, max_turns=max_turns, max_output_errors=max_output_errors)
    usage = {"output_tokens": 0, "input_tokens": 0}
    turns: list[dict[str, Any]] = []

    def count(reply: PlannerReply) -> None:
        usage["output_tokens"] += reply.output_tokens
        usage["input_tokens"] += reply.prompt_tokens
        if reply.token_ids:
            turns.append({"prompt_ids": reply.prompt_ids, "token_ids": reply.token_ids, "logprobs": reply.logprobs})

    drive(planner, ep, messages, tools or None, count)
    verification = infra_v
    if not ep.infra:
        try:
            verification = env.verify()
        except EnvFault as e:
            ep.end("infra", f"verify raised {type(e).__name__}: {e}")
    costs = {"output_tokens": float(usage["output_tokens"]), "input_tokens": float(usage["input_tokens"]),
             "tool_calls": float(ep.tool_calls), "turns": float(ep.turns), "user_turns": float(ep.user_turns),
             "parse_errors": float(ep.parse_errors), "wall_s": time.perf_counter() - t0}
    return ChatEpisode(task, name, messages, tools, ep.steps, verification if not ep.infra else infra_v, ep.finish_reason,
                       ep.infra, costs, turns, dict(ep.output_errors), str(getattr(env, "ledger_hash", "")))


def feedback_summary(fb: Feedback | None) -> str:
    """One line for a Feedback: "ok", "CODE: message", or "-" (none)."""
    if fb is None:
        return "-"
    return "ok" if fb.ok else f"{getattr(fb.error_code, 'value', fb.error_code)}: {fb.message}"
