"""Multi-turn user conversations (contract version 2) through the episode rules, the token-level runner, the
oracle and SFT encoding.

`FollowUpEnv` below is a small real env written for these tests (one counter tool, a scripted user who
asks three things in turn): it is the smallest env that speaks the conversation part of the contract, so
the rules can be checked apart from any benchmark. The BFCL env runs the same path on its own data
(tests/unit/test_bfcl.py).
"""
from __future__ import annotations

from typing import Any

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs.contract import (
    CONVERSATION_VERSION, SCHEMA_VERSION, Action, ContractError, ErrorCode, Feedback, Task, ToolSpec, Trajectory, Verification,
)
from mpa_jax.envs.oracle import run_oracle_episode
from mpa_jax.envs.episode import Episode, Reply
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine

REQUESTS = ["Add 2 to the counter.", "Now add 5 more.", "What is the counter now?"]
GOLD_ADDS = [2, 5]


class FollowUpEnv:
    """A user with three requests; verification: the counter is 7 and the last answer says 7."""

    kind = "followup"

    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return [ToolSpec(name="add", app="counter", domain="utilities", description="Add n to the counter.",
                         parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                     "additionalProperties": False}, kind="write")]

    def reset(self, task: Task) -> dict[str, Any]:
        self.counter, self.turn, self.answers = 0, 0, []
        return {"messages": [{"role": "system", "content": "You keep a counter."}, {"role": "user", "content": REQUESTS[0]}],
                "tools": [s.to_openai() for s in self.tool_specs(task)]}

    def step(self, action: Action) -> Feedback:
        if action.kind == "tool_call":
            if action.name != "add" or not isinstance(action.arguments.get("n"), int):
                return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "add takes an integer n", action.call_id)
            self.counter += action.arguments["n"]
            return Feedback(call_id=action.call_id, status="ok", result={"counter": self.counter})
        self.answers.append(action.text)
        self.turn += 1
        if self.turn < len(REQUESTS):
            return Feedback.next_user_turn(REQUESTS[self.turn], action.call_id)
        return Feedback(call_id=action.call_id, status="ok")

    def verify(self) -> Verification:
        ok = self.counter == 7 and bool(self.answers) and "7" in self.answers[-1]
        return Verification(success=ok, score=float(ok))

    def close(self) -> None:
        pass


def _task() -> Task:
    gold = [{"kind": "tool_call", "name": "add", "arguments": {"n": 2}}, {"kind": "message", "text": "Added 2."},
            {"kind": "tool_call", "name": "add", "arguments": {"n": 5}}, {"kind": "message", "text": "Added 5."},
            {"kind": "message", "text": "The counter is 7."}]
    return Task(id="conv-1", domain="utilities", category="tool_use", difficulty=1, instruction=REQUESTS[0],
                tools=["add"], verifier={}, gold=gold)


def _gold_replies() -> list[str]:
    return [tk.format_tool_call("add", {"n": 2}), "Added 2.", tk.format_tool_call("add", {"n": 5}), "Added 5.",
            "The counter is 7."]


def test_feedback_user_turn_round_trips_and_version_1_data_reads():
    fb = Feedback.next_user_turn("and then?", "call_1_0")
    assert not fb.conversation_over and Feedback.from_json(fb.to_json()) == fb
    assert fb.schema_version == CONVERSATION_VERSION == 2 and SCHEMA_VERSION == 1
    v1 = {"call_id": "c", "status": "ok", "error_code": None, "message": "", "hint": "", "result": None, "cost": {},
          "schema_version": 1}
    assert Feedback.from_dict(v1).conversation_over
    assert Feedback.from_dict(v1).to_dict() == v1  # single-request feedback writes version-1 JSON, byte for byte
    assert Feedback.error(ErrorCode.INVALID_ARGUMENTS, "x").conversation_over  # an error never carries a next turn
    with pytest.raises(ContractError, match="empty"):
        Feedback.next_user_turn("")


def test_the_next_user_turn_reaches_the_planner_and_is_masked(tok):
    engine = ScriptedEngine(tok, _gold_replies())
    (traj,) = run_episodes(engine, tok, [_task()], FollowUpEnv, EpisodeConfig.defaults(max_turns=2, max_new_tokens=64))
    assert traj.verification.success and traj.finish_reason == "answer" and not traj.infra_failure
    assert traj.user_turns() == REQUESTS[1:] and traj.costs["user_turns"] == 2 and traj.costs["turns"] == 5
    # the engine was prompted with each follow-up as a user message, after the reply it answers
    prompts = [tok.decode(p) for batch, _, _ in engine.calls for p in batch]
    for i, req in enumerate(REQUESTS[1:]):
        first = next(j for j, p in enumerate(prompts) if req in p)
        assert prompts[first].endswith(f"<|im_start|>user\n{req}<|im_end|>\n<|im_start|>assistant\n")
        assert "Added 2." in prompts[first] and all(req not in p for p in prompts[:first])
    # user turns are in the chat as user messages, and no token of them is trained on
    assert [m["content"] for m in traj.messages if m["role"] == "user"] == REQUESTS
    text_ids = tok.encode(f"<|im_start|>user\n{REQUESTS[1]}<|im_end|>")
    at = next(i for i in range(len(traj.tokens)) if traj.tokens[i:i + len(text_ids)] == text_ids)
    assert set(traj.loss_mask[at:at + len(text_ids)]) == {0}
    assert tok.decode([t for t, m in zip(traj.tokens, traj.loss_mask) if m]) == "".join(r + "<|im_end|>" for r in _gold_replies())
    # a trajectory keeps its user turns through JSON
    assert Trajectory.from_json(traj.to_json()).user_turns() == REQUESTS[1:]


def test_a_missing_follow_up_answer_fails_and_the_turn_limit_is_per_user_turn(tok):
    # the planner stops after the second request: the env still had a third, so the answer check fails
    engine = ScriptedEngine(tok, _gold_replies()[:4] + ["Done."])
    (traj,) = run_episodes(engine, tok, [_task()], FollowUpEnv, EpisodeConfig.defaults(max_turns=2, max_new_tokens=64))
    assert not traj.verification.success and traj.costs["user_turns"] == 2
    # two tool calls in one user turn with max_turns=2: the limit ends the episode inside that turn
    looping = [tk.format_tool_call("add", {"n": 2}), "ok", tk.format_tool_call("add", {"n": 1}), tk.format_tool_call("add", {"n": 1})]
    (traj,) = run_episodes(ScriptedEngine(tok, looping), tok, [_task()], FollowUpEnv, EpisodeConfig.defaults(max_turns=2, max_new_tokens=64))
    assert traj.finish_reason == "max_turns" and traj.costs["user_turns"] == 1 and traj.costs["turns"] == 4


def test_episode_rules_show_the_user_turn_and_end_when_the_env_sends_none():
    env = FollowUpEnv()
    env.reset(_task())
    ep = Episode(_task(), env.step, max_turns=3)
    msg, shown = ep.act(Reply(content="Added nothing."))
    assert msg == {"role": "assistant", "content": "Added nothing."} and shown == [{"role": "user", "content": REQUESTS[1]}]
    assert not ep.ended and ep.user_turns == 1
    ep.act(Reply(content="still nothing"))
    _, shown = ep.act(Reply(content="bye"))
    assert shown == [] and ep.finish_reason == "answer" and ep.user_turns == 2


def test_oracle_demonstration_of_a_conversation_masks_user_turns(tok):
    ep = run_oracle_episode(FollowUpEnv(), _task(), seed=0)
    assert ep.verification.success
    assert [m["content"] for m in ep.messages if m["role"] == "user"] == REQUESTS
    ids, mask = tk.encode_chat(tok, ep.messages, ep.tools)
    text = tk.render_chat(tok, ep.messages, ep.tools, add_generation_prompt=False)
    assert tok.decode(ids) == text
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    for req in REQUESTS:
        assert req in text and req not in trained  # SFT never trains on the user's words
    assert "The counter is 7." in trained and "Added 2." in trained
