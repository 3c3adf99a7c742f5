"""A text-level episode loop for any planner backend (OpenAI-compatible endpoints, SGLang, scripted).

The token-exact training loop is `mpa_jax.rollout.agent_loop` (it sees the harness as an env); this one
is for evaluating planners that only speak chat (no token ids), and for the CLI. It never raises for a
backend problem: INFRA/TIMEOUT replies end the episode as an infra failure (never a reward), a parse
error is shown to the planner as a tool turn and the episode goes on.
"""
from __future__ import annotations

import time
from typing import Any

from mpa_jax.envs.contract import Action, Feedback, Step, Task, Trajectory, Verification
from mpa_jax.envs.render import feedback_to_message


def run_episode(planner: Any, env: Any, task: Task, max_turns: int = 8, harness_version: str = "none") -> Trajectory:
    """One episode of `planner` on `env` (a raw env or a HarnessEnv); the Trajectory has no token ids
    unless the planner returns them (then they are kept per turn in provenance["turns"])."""
    t0 = time.perf_counter()
    steps: list[Step] = []
    infra = ""
    finish = ""
    out_tokens = in_tokens = 0
    turns: list[dict[str, Any]] = []
    try:
        obs = env.reset(task)
    except Exception as e:  # noqa: BLE001
        return _traj(task, [], [], Verification(False, 0.0, infra_error=True), "infra", f"reset failed: {e}", {}, harness_version, t0, [])
    messages = [dict(m) for m in obs["messages"]]
    tools = obs.get("tools") or None
    for turn in range(max_turns):
        reply = planner.respond(messages, tools)
        out_tokens += reply.output_tokens
        in_tokens += reply.prompt_tokens
        if reply.token_ids:
            turns.append({"prompt_ids": reply.prompt_ids, "token_ids": reply.token_ids, "logprobs": reply.logprobs})
        if reply.infra:
            infra, finish = reply.error.message, "infra"
            break
        if reply.error is not None:
            a = Action(kind="tool_call", name="", raw=reply.raw or reply.text)
            fb = reply.error
            fb.call_id = f"call_{turn}_0"
            steps.append(Step(action=a, feedback=fb))
            messages.append({"role": "assistant", "content": reply.raw or reply.text})
            messages.append(feedback_to_message(fb))
            continue
        if not reply.calls:
            a = Action.message(reply.text, raw=reply.raw)
            messages.append(reply.to_message())
            fb = env.step(a)
            steps.append(Step(action=a, feedback=fb))
            if fb is not None and fb.is_infra:
                infra, finish = fb.message, "infra"
            elif fb is None or fb.ok:
                finish = "answer"
            else:
                messages.append(feedback_to_message(fb))
                continue
            break
        for j, c in enumerate(reply.calls):
            c.setdefault("id", f"call_{turn}_{j}")
        messages.append(reply.to_message())
        stop = False
        for c in reply.calls:
            from mpa_jax.envs.render import tool_call_to_action

            a = tool_call_to_action({"function": {"name": c["name"], "arguments": c.get("arguments", {})}, "id": c["id"]}, raw=reply.raw)
            fb = env.step(a)
            steps.append(Step(action=a, feedback=fb))
            if fb.is_infra:
                infra, finish, stop = fb.message, "infra", True
                break
            messages.append(feedback_to_message(fb))
        if stop:
            break
    else:
        finish = "max_turns"
    if infra:
        verification = Verification(False, 0.0, infra_error=True)
    else:
        try:
            verification = env.verify()
        except Exception as e:  # noqa: BLE001
            infra, finish = f"verify raised {e}", "infra"
            verification = Verification(False, 0.0, infra_error=True)
    costs = {"output_tokens": float(out_tokens), "input_tokens": float(in_tokens),
             "tool_calls": float(sum(1 for s in steps if s.action.kind == "tool_call"))}
    traj = _traj(task, steps, messages, verification, finish or "max_turns", infra, costs, harness_version, t0, turns)
    traj.provenance["planner"] = getattr(planner, "name", type(planner).__name__)
    try:
        env.close()
    except Exception:  # noqa: BLE001
        pass
    return traj


def _traj(task: Task, steps: list[Step], messages: list[dict[str, Any]], v: Verification, finish: str, infra: str,
          costs: dict[str, float], harness_version: str, t0: float, turns: list[dict[str, Any]]) -> Trajectory:
    costs = dict(costs, wall_s=time.perf_counter() - t0)
    prov = {"task": task.id, "domain": task.domain, "category": task.category, "template": task.template,
            "split": task.split, "harness_version": harness_version, "infra_reason": infra}
    if turns:
        prov["turns"] = turns
    return Trajectory(task_id=task.id, tokens=[], loss_mask=[], logprobs=[], steps=steps, verification=v, costs=costs,
                      provenance=prov, messages=messages, finish_reason=finish, infra_failure=bool(infra))


def oracle_trajectory(env: Any, task: Task, seed: int = 0, harness_version: str = "none") -> Trajectory:
    """The scripted oracle on `env` (raw or harness-wrapped) as a text-level Trajectory."""
    from mpa_jax.envs.oracle import run_oracle_episode

    t0 = time.perf_counter()
    try:
        ep = run_oracle_episode(env, task, seed=seed)
    finally:
        try:
            env.close()
        except Exception:  # noqa: BLE001
            pass
    costs = {"tool_calls": float(sum(1 for s in ep.steps if s.action.kind == "tool_call"))}
    traj = _traj(task, ep.steps, ep.messages, ep.verification, "answer", "", costs, harness_version, t0, [])
    traj.provenance["planner"] = "oracle"
    return traj


def feedback_summary(fb: Feedback | None) -> str:
    if fb is None:
        return "-"
    return "ok" if fb.ok else f"{getattr(fb.error_code, 'value', fb.error_code)}: {fb.message}"
