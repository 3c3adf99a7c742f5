"""A scripted oracle planner: solves a task from its gold plan, the source of cold-start demonstrations.

`OraclePlanner` is a `Planner` like any other: its episodes run through the one chat-level driver under the
episode rules (`envs.episode`). It reads only the gold plan and the chat it is shown (each call's Feedback as
the tool message's JSON), never hidden state.
Gold steps: {"kind": "tool_call", "name", "arguments", "agent"?, "group"?, "fallbacks"?: [steps], "why"?},
{"kind": "delegate", "agent", "instruction"}, {"kind": "message", "text"}. In a conversation (an env that
answers a message with the user's next turn) the gold holds one message per user turn and the plan goes on.

Natural variation (seeded): consecutive steps sharing a `group` are independent, so their order is
shuffled and they are sent either together (parallel tool calls in one turn) or one per turn; reasoning
phrasing varies. Recovery the way a good agent does it: retry on TRANSIENT/RATE_LIMITED,
apply the fix a PRECONDITION_FAILED error names and retry, switch to the next fallback on other errors.
With `variation=False` the run is canonical (the quality gate replays gold this way).
"""
from __future__ import annotations

import dataclasses
import json
import random
from typing import Any, Generator

from mpa_jax.envs.contract import ErrorCode, Feedback, Task
from mpa_jax.envs.episode import ChatEpisode, PlannerReply, run_chat_episode
from mpa_jax.envs.tools import TOOLS

# INFRA/TIMEOUT never reach the planner: the episode rules end the episode as infra first
RETRYABLE = {ErrorCode.TRANSIENT, ErrorCode.RATE_LIMITED}
MAX_RECOVERIES = 4


def _why(step: dict[str, Any], rng: random.Random | None) -> str:
    if step.get("why"):
        return step["why"]
    name, args = step.get("name", ""), step.get("arguments", {})
    tool = TOOLS.get(name)
    e = tool.entity if tool else None
    pick = (lambda xs: rng.choice(xs)) if rng else (lambda xs: xs[0])
    if step["kind"] == "delegate":
        return pick([f"The {step['agent']} role has the tools for this; I'll hand it over.",
                     f"Delegating this part to {step['agent']}."])
    if tool and tool.op == "search":
        return pick([f"I need to find {args.get('query')!r} among the {e.label}s.",
                     f"Let me look up {args.get('query')!r} in {e.app}."])
    if tool and tool.op == "get":
        return pick([f"Opening {args.get('id')} to read its details.", f"I need the full details of {args.get('id')}."])
    if tool and tool.op == "create":
        return pick([f"Now I can create the {e.label}.", f"Creating the {e.label} with those details."])
    if tool and tool.op == "update":
        return pick([f"Updating {args.get('id')}.", f"Now I change {args.get('id')} as asked."])
    if tool and tool.op == "delete":
        return pick([f"Deleting {args.get('id')}.", f"Removing {args.get('id')} now."])
    if name in _HANDLER_WHY:
        return pick(_HANDLER_WHY[name])
    return pick([f"Next I'll call {name}.", f"I'll use {name} for this."])


_HANDLER_WHY = {
    "convert_units": ["Let me convert that with the unit converter.", "The unit converter should handle this."],
    "calculate": ["I'll work it out with the calculator.", "Let me calculate that."],
    "send_sms": ["Now I can send the text.", "Sending the text message."],
    "send_email": ["Now I'll send the email.", "Sending the email."],
    "make_call": ["Starting the call.", "Calling now."],
    "get_route": ["Let me get the route between the two addresses.", "I'll check the route."],
    "get_weather": ["Let me check the forecast.", "Checking the weather."],
    "book_ride": ["Booking the ride.", "Now I'll book the ride."],
    "transfer_money": ["Making the transfer.", "Now I'll send the money."],
    "pay_bill": ["Paying the bill.", "Now I'll pay the bill."],
    "play_song": ["Starting playback.", "Playing the song."],
    "get_device_status": ["Let me check the device status.", "I'll read the phone's status."],
    "place_order": ["Now I'll check out the cart.", "Placing the order."],
}


def _shown(messages: list[dict[str, Any]]) -> str | list[Feedback]:
    """What the env answered to the oracle's last reply, read from the chat as any planner sees it: the
    user's next turn (a conversation), or the Feedback of each call (the tool messages' canonical JSON)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    after = messages[last + 1:]
    user = [m for m in after if m.get("role") == "user"]
    if user:
        return str(user[-1].get("content") or "")
    out = []
    for m in after:
        body = json.loads(m["content"])
        if body["status"] == "ok":
            out.append(Feedback(call_id=m.get("tool_call_id", ""), status="ok", result=body.get("result")))
        else:
            fb = Feedback.error(ErrorCode(body["error"]), body.get("message", ""), m.get("tool_call_id", ""), body.get("hint", ""))
            out.append(dataclasses.replace(fb, result=body.get("result")))
    return out


class OraclePlanner:
    """The oracle as a `Planner` (`envs.episode`): replies from a plan (gold or a corrupted copy), reading
    only the chat it is shown. Seeded variation (`seed`; None = canonical) and the recovery policy of the
    module docstring; when the plan is done it says so (`PlannerReply.stop`)."""

    name = "oracle"

    def __init__(self, plan: list[dict[str, Any]], seed: int | None = None, reasoning: str = "full") -> None:
        self.plan, self.think = plan, reasoning != "none"
        self.rng = random.Random(seed) if seed is not None else None
        self.n = 0
        self._script: Generator[PlannerReply, Any, None] | None = None

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PlannerReply:
        try:
            if self._script is None:
                self._script = self._run()
                return next(self._script)
            return self._script.send(_shown(messages))
        except StopIteration:
            return PlannerReply(stop=True)

    def _calls(self, steps: list[dict[str, Any]], reasoning: str) -> PlannerReply:
        calls = []
        for step in steps:
            self.n += 1
            cid = f"call_{self.n}"
            if step["kind"] == "delegate":
                calls.append({"name": "delegate", "arguments": {"agent": step["agent"], "instruction": step["instruction"]}, "id": cid})
            else:
                calls.append({"name": step["name"], "arguments": dict(step["arguments"]), "id": cid,
                              "agent": step.get("agent", "planner")})
        return PlannerReply(calls=calls, reasoning=reasoning if self.think else None)

    def _recover(self, step: dict[str, Any], fb: Feedback) -> Generator[PlannerReply, Any, None]:
        fallbacks = list(step.get("fallbacks", []))
        for _ in range(MAX_RECOVERIES):
            if fb.ok:
                return
            code = ErrorCode(fb.error_code)
            if code in RETRYABLE:
                reason = f"{step['name']} failed with {code.value} ({fb.message}); that is temporary, so I'll retry."
            elif code == ErrorCode.PRECONDITION_FAILED and isinstance(fb.result, dict) and "fix" in fb.result:
                fix = fb.result["fix"]
                fix_step = {"kind": "tool_call", "name": fix["name"], "arguments": fix["arguments"], "agent": step.get("agent", "planner")}
                fix_fb = (yield self._calls([fix_step], f"{fb.message}. I'll fix that with {fix['name']} first."))[0]
                if not fix_fb.ok:
                    return
                reason = f"Now that {fix['name']} succeeded, retrying {step['name']}."
            elif fallbacks:
                nxt = fallbacks.pop(0)
                reason = nxt.get("why") or f"{step['name']} rejected that ({fb.message}). I'll try {nxt['name']} instead."
                step = nxt
            else:
                return
            fb = (yield self._calls([step], reason))[0]

    def _page(self, step: dict[str, Any], fb: Feedback) -> Generator[PlannerReply, Any, None]:
        """A search page that says has_more and lacks an exact match for the query: fetch the next page."""
        for _ in range(MAX_RECOVERIES):
            res = fb.result if isinstance(fb.result, dict) else {}
            if not (fb.ok and res.get("has_more")):
                return
            q = str(step["arguments"].get("query", "")).strip().lower()
            if any(str(v).strip().lower() == q for r in res.get("results", []) for k, v in r.items() if k != "id"):
                return
            step = dict(step, arguments={**step["arguments"], "offset": res["next_offset"]})
            step.pop("group", None)
            fb = (yield self._calls([step], f"That page has no exact match for {q!r} and there are more results; fetching the next page."))[0]

    def _run(self) -> Generator[PlannerReply, Any, None]:
        plan, i = self.plan, 0
        while i < len(plan):
            step = plan[i]
            if step["kind"] == "message":
                why = step.get("why") or "I have everything I need to reply."
                shown = yield PlannerReply(text=step["text"], reasoning=why if self.think else None)
                if isinstance(shown, str):  # a conversation: the user's next turn, the plan goes on
                    i += 1
                    continue
                return  # the env refused the message: nothing more to say
            batch = [step]
            g = step.get("group")
            j = i + 1
            while g is not None and j < len(plan) and plan[j].get("group") == g:
                batch.append(plan[j])
                j += 1
            i = j
            if self.rng is not None and len(batch) > 1:
                self.rng.shuffle(batch)
            together = len(batch) > 1 and (self.rng.random() < 0.5 if self.rng is not None else False)
            chunks = [batch] if together else [[s] for s in batch]
            for chunk in chunks:
                fbs = yield self._calls(chunk, " ".join(_why(s, self.rng) for s in chunk))
                for s, fb in zip(chunk, fbs):
                    if not fb.ok:
                        yield from self._recover(s, fb)
                    else:
                        yield from self._page(s, fb)


def plan_turn_bound(plan: list[dict[str, Any]]) -> int:
    """The most replies the oracle can give for `plan` (each step once, plus at most two per recovery or page):
    the turn limit of an oracle episode run without one, which the rules then never reach."""
    return max(1, len(plan) * (1 + 2 * MAX_RECOVERIES))


def run_plan(env: Any, task: Task, plan: list[dict[str, Any]], seed: int | None = None, reasoning: str = "full",
             max_turns: int | None = None) -> ChatEpisode:
    """Run `plan` (gold or a corrupted copy) with the oracle's recovery policy through the one chat-level
    driver (`envs.episode.run_chat_episode`, the episode rules included); seed None = canonical.

    `reasoning` "full" writes the oracle's reasoning sentences, "none" leaves them out (`envs.context`);
    `max_turns` per user turn (None: `plan_turn_bound(plan)`).
    """
    planner = OraclePlanner(plan, seed, reasoning)
    return run_chat_episode(planner, env, task, max_turns=plan_turn_bound(plan) if max_turns is None else max_turns)


def run_oracle_episode(env: Any, task: Task, seed: int = 0, variation: bool = True, reasoning: str = "full",
                       max_turns: int | None = None) -> ChatEpisode:
    """Solve `task` from its gold with seeded natural variation; the chat, steps and verification."""
    return run_plan(env, task, task.gold, seed if variation else None, reasoning, max_turns)
