"""A scripted oracle planner: solves a task from its gold plan, the source of cold-start demonstrations.

It reads only the gold plan and the Feedback the env returns (what any planner sees), never hidden state.
Gold steps: {"kind": "tool_call", "name", "arguments", "agent"?, "group"?, "fallbacks"?: [steps], "why"?},
{"kind": "delegate", "agent", "instruction"}, {"kind": "message", "text"}. In a conversation (an env that
answers a message with the user's next turn) the gold holds one message per user turn and the plan goes on.

Natural variation (seeded): consecutive steps sharing a `group` are independent, so their order is
shuffled and they are sent either together (parallel tool calls in one turn) or one per turn; reasoning
phrasing varies. Recovery the way a good agent does it: retry on TRANSIENT/RATE_LIMITED/TIMEOUT/INFRA,
apply the fix a PRECONDITION_FAILED error names and retry, switch to the next fallback on other errors.
With `variation=False` the run is canonical (the quality gate replays gold this way).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Step, Task, Verification
from mpa_jax.envs.render import action_to_message, feedback_to_message
from mpa_jax.envs.tools import TOOLS

RETRYABLE = {ErrorCode.TRANSIENT, ErrorCode.RATE_LIMITED, ErrorCode.TIMEOUT, ErrorCode.INFRA}
MAX_RECOVERIES = 4


@dataclasses.dataclass
class OracleEpisode:
    """The full chat (observation messages first), the tools, the Action/Feedback steps and the verdict."""

    task_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    steps: list[Step]
    verification: Verification
    ledger_hash: str = ""


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


class _Runner:
    def __init__(self, env: Any, task: Task, rng: random.Random | None, think: bool = True) -> None:
        self.env, self.task, self.rng, self.think = env, task, rng, think
        obs = env.reset(task)
        self.messages: list[dict[str, Any]] = list(obs["messages"])
        self.tools = obs["tools"]
        self.steps: list[Step] = []
        self.n = 0

    def _action(self, step: dict[str, Any]) -> Action:
        self.n += 1
        cid = f"call_{self.n}"
        if step["kind"] == "delegate":
            return Action(kind="delegate", name=step["agent"], text=step["instruction"], call_id=cid)
        return Action(kind="tool_call", name=step["name"], arguments=dict(step["arguments"]), call_id=cid,
                      agent=step.get("agent", "planner"))

    def send(self, steps: list[dict[str, Any]], reasoning: str) -> list[Feedback]:
        actions = [self._action(s) for s in steps]
        self.messages.append(action_to_message(actions, reasoning=reasoning if self.think else None))
        fbs = []
        for a in actions:
            fb = self.env.step(a)
            self.steps.append(Step(action=a, feedback=fb))
            self.messages.append(feedback_to_message(fb))
            fbs.append(fb)
        return fbs

    def recover(self, step: dict[str, Any], fb: Feedback) -> None:
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
                fix_fb = self.send([fix_step], f"{fb.message}. I'll fix that with {fix['name']} first.")[0]
                if not fix_fb.ok:
                    return
                reason = f"Now that {fix['name']} succeeded, retrying {step['name']}."
            elif fallbacks:
                nxt = fallbacks.pop(0)
                reason = nxt.get("why") or f"{step['name']} rejected that ({fb.message}). I'll try {nxt['name']} instead."
                step = nxt
            else:
                return
            fb = self.send([step], reason)[0]

    def page(self, step: dict[str, Any], fb: Feedback) -> None:
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
            fb = self.send([step], f"That page has no exact match for {q!r} and there are more results; fetching the next page.")[0]

    def run(self, plan: list[dict[str, Any]]) -> None:
        i = 0
        while i < len(plan):
            step = plan[i]
            if step["kind"] == "message":
                a = Action.message(step["text"])
                why = step.get("why") or "I have everything I need to reply."
                self.messages.append(action_to_message(a, reasoning=why if self.think else None))
                fb = self.env.step(a)
                if fb is not None and fb.ok and fb.user_turn:  # a conversation: the user's next turn, plan goes on
                    self.steps.append(Step(action=a, feedback=fb))
                    self.messages.append({"role": "user", "content": fb.user_turn})
                    i += 1
                    continue
                self.steps.append(Step(action=a, feedback=None))
                return  # a message that gets no next user turn ends the episode
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
                reason = " ".join(_why(s, self.rng) for s in chunk)
                fbs = self.send(chunk, reason)
                for s, fb in zip(chunk, fbs):
                    if not fb.ok:
                        self.recover(s, fb)
                    else:
                        self.page(s, fb)


def run_plan(env: Any, task: Task, plan: list[dict[str, Any]], seed: int | None = None,
             reasoning: str = "full") -> OracleEpisode:
    """Run `plan` (gold or a corrupted copy) with the oracle's recovery policy; seed None = canonical.

    `reasoning` "full" writes the oracle's reasoning sentences, "none" leaves them out (`envs.context`).
    """
    think = reasoning != "none"
    runner = _Runner(env, task, random.Random(seed) if seed is not None else None, think)
    runner.run(plan)
    return OracleEpisode(task.id, runner.messages, runner.tools, runner.steps, env.verify(), getattr(env, "ledger_hash", ""))


def run_oracle_episode(env: Any, task: Task, seed: int = 0, variation: bool = True,
                       reasoning: str = "full") -> OracleEpisode:
    """Solve `task` from its gold with seeded natural variation; the chat, steps and verification."""
    return run_plan(env, task, task.gold, seed if variation else None, reasoning)

