"""The multi-turn agent loop: many episodes at once, exact token-in/token-out Trajectories.

Per episode: `env.reset(task)` gives the first messages and tool schemas; the prompt is rendered with
the chat template; then, until the episode ends,

    generate -> append the sampled ids as sampled (mask 1, behaviour log-probs) -> parse the text ->
    step the env with the parsed Action(s) -> render the Feedback turn(s) and the next generation
    prompt and append them (mask 0) -> repeat.

Scheduling: every round, each live episode contributes its prompt and the engine generates all of
them in one call (so decode steps of different episodes share batches); finished episodes make room
for the next tasks (at most `batch_size` live at once).

What ends an episode (Trajectory.finish_reason):
- "answer": the model replied with plain text (no tool call): a `message` Action to the user, sent to
  the env (which records it for answer checks).
- "max_turns": `max_turns` assistant turns were used; "max_tokens": the episode reached
  `max_total_tokens` (the last turn is cut to fit; feedback that would not fit is kept in `steps`
  and `messages` but not in the tokens, so `len(tokens) <= max_total_tokens` always).
- "infra": the env answered INFRA/TIMEOUT, raised, or the engine failed; `infra_failure` is set and
  the Verification carries `infra_error` (DESIGN §7: such episodes never become rewards).

Malformed output (a bad tool call) is not a crash: the turn gets one error Feedback
(`INVALID_ARGUMENTS`, the parser's message and a hint with the expected format) shown to the model as
a tool turn, and the episode goes on. A turn that did not end with `<|im_end|>` (cut by the token
limit, or stopped by `<|endoftext|>`) is closed by appending `<|im_end|>` with mask 0 and
log-prob 0 so the next turn renders exactly as the chat template would.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Step, Task, Trajectory, Verification
from mpa_jax.rollout.types import EngineError, GenerateResult, RolloutEngine, SamplingParams

PARSE_HINT = (
    'Call a tool as <tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call> with a JSON object '
    "of arguments, or answer the user in plain text."
)


@dataclasses.dataclass
class AgentLoopConfig:
    """Limits and sampling of the agent loop (from `config.rollout`)."""

    max_turns: int = 8
    max_new_tokens: int = 256
    max_total_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    batch_size: int = 16  # live episodes at once
    seed: int = 0
    env_kind: str = "sandbox"
    planner: str = "policy"
    harness_version: str = "none"

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_total_tokens", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"AgentLoopConfig.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_config(cls, rollout_cfg: Any, seed: int = 0, greedy: bool = False, **overrides: Any) -> "AgentLoopConfig":
        """From the `c.rollout` section; `greedy` forces temperature 0 (evaluation)."""
        kw = dict(
            max_turns=int(rollout_cfg.max_turns),
            max_new_tokens=int(rollout_cfg.max_new_tokens),
            max_total_tokens=int(rollout_cfg.max_total_tokens),
            temperature=0.0 if greedy else float(rollout_cfg.temperature),
            top_p=float(rollout_cfg.top_p),
            top_k=int(rollout_cfg.top_k),
            batch_size=int(rollout_cfg.batch_size),
            seed=int(seed),
        )
        kw.update(overrides)
        return cls(**kw)


@dataclasses.dataclass
class _Episode:
    index: int
    task: Task
    env: Any = None
    tools: list[dict[str, Any]] | None = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    steps: list[Step] = dataclasses.field(default_factory=list)
    turns: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    device_s: float = 0.0
    t0: float = 0.0
    versions: list[str] = dataclasses.field(default_factory=list)
    finish_reason: str = ""
    infra: str = ""  # non-empty: why the episode is an infra failure


def _render_copy(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for the template with ChatML control strings removed from assistant text.

    Only the part after the last assistant turn is tokenised, and it does not depend on assistant
    text; but an assistant turn whose sampled text spells `<|im_start|>`/`<|im_end|>` would confuse
    the template's turn boundaries, so the copy used for rendering drops those strings.
    """
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            m = dict(m)
            for key in ("content", "reasoning_content"):
                if isinstance(m.get(key), str):
                    m[key] = m[key].replace("<|im_start|>", "").replace("<|im_end|>", "")
        out.append(m)
    return out


def episode_seed(base: int, index: int, turn: int) -> int:
    """Deterministic per-(episode, turn) sampling seed."""
    return (base * 1_000_003 + index * 10_007 + turn) % (2**31 - 1)


def run_episodes(
    engine: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    env_factory: Callable[[], Any],
    cfg: AgentLoopConfig | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    env_pool: Any = None,
) -> list[Trajectory]:
    """Run one episode per task (in task order in the result) and return their Trajectories.

    `env_factory()` makes a fresh env per episode (closed at the end). `on_done` is called as each
    episode finishes (progress bars, streaming writes). `env_pool` (`envs.pool.EnvPool`; default: the
    sandbox inline, other kinds 8 threads / 60 s) steps the episodes of a round concurrently, with
    per-kind concurrency limits; a step past its kind's timeout is TIMEOUT Feedback (the episode is infra).
    """
    from mpa_jax import tokenizer as tk
    from mpa_jax.envs.render import action_to_message, feedback_to_message, tool_call_to_action

    from mpa_jax.envs.pool import EnvPool, KindLimits

    cfg = cfg or AgentLoopConfig()
    pool = env_pool if env_pool is not None else EnvPool({"sandbox": KindLimits(0, 30.0)})
    step = lambda env, action: pool.step_all([(env, action)])[0]  # noqa: E731
    im_end = tokenizer.token_id("<|im_end|>")
    stop_ids = tuple(dict.fromkeys([im_end, *tokenizer.eos_token_ids]))
    queue = list(enumerate(tasks))[::-1]
    live: list[_Episode] = []
    results: dict[int, Trajectory] = {}

    def finish(ep: _Episode, reason: str) -> None:
        ep.finish_reason = ep.finish_reason or reason
        results[ep.index] = _to_trajectory(ep, cfg, engine)
        if ep.env is not None:
            try:
                ep.env.close()
            except Exception:  # noqa: BLE001 - closing must not lose the trajectory
                pass
        if on_done is not None:
            on_done(results[ep.index])

    def start(index: int, task: Task) -> _Episode | None:
        ep = _Episode(index=index, task=task, t0=time.perf_counter())
        try:
            ep.env = env_factory()
            obs = ep.env.reset(task)
            ep.messages = [dict(m) for m in obs["messages"]]
            ep.tools = list(obs.get("tools") or []) or None
            ep.ids = tk.generation_prompt_ids(tokenizer, ep.messages, ep.tools)
        except Exception as e:  # noqa: BLE001 - a broken env/task is an infra failure, not a crash
            ep.infra = f"reset failed: {type(e).__name__}: {e}"
            finish(ep, "infra")
            return None
        ep.mask = [0] * len(ep.ids)
        ep.logprobs = [0.0] * len(ep.ids)
        return ep

    while queue or live:
        while queue and len(live) < cfg.batch_size:
            ep = start(*queue.pop())
            if ep is not None:
                live.append(ep)
        if not live:
            continue
        # Group live episodes by their token budget for this turn (one engine call per budget).
        groups: dict[int, list[_Episode]] = defaultdict(list)
        for ep in list(live):
            budget = min(cfg.max_new_tokens, cfg.max_total_tokens - len(ep.ids))
            if budget < 1:
                live.remove(ep)
                finish(ep, "max_tokens")
                continue
            groups[budget].append(ep)
        for budget, eps in groups.items():
            params = SamplingParams(
                max_new_tokens=budget,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                stop_token_ids=stop_ids,
            )
            seeds = [episode_seed(cfg.seed, ep.index, ep.turns) for ep in eps]
            t0 = time.perf_counter()
            try:
                outs = engine.generate([ep.ids for ep in eps], params, seeds)
            except EngineError as e:
                for ep in eps:
                    ep.infra = f"engine error: {e}"
                    live.remove(ep)
                    finish(ep, "infra")
                continue
            share = (time.perf_counter() - t0) / len(eps)

            def after(ep: _Episode, out: GenerateResult) -> bool:
                ep.device_s += share
                return _after_generate(ep, out, tokenizer, im_end, cfg, tk, action_to_message, feedback_to_message,
                                       tool_call_to_action, step)

            # Every episode of the round acts at once (one slow env never holds up the others); kinds
            # the pool runs inline (the sandbox) stay in this thread.
            if all(pool.limit(pool.kind_of(ep.env)).concurrency == 0 for ep in eps):
                endeds = [after(ep, out) for ep, out in zip(eps, outs)]
            else:
                with ThreadPoolExecutor(len(eps), thread_name_prefix="episode") as ex:
                    endeds = list(ex.map(after, eps, outs))
            for ep, ended in zip(eps, endeds):
                if ended:
                    live.remove(ep)
                    finish(ep, ep.finish_reason)
    if env_pool is None:
        pool.close()
    return [results[i] for i in range(len(tasks))]


def _after_generate(
    ep: _Episode,
    out: GenerateResult,
    tokenizer: Any,
    im_end: int,
    cfg: AgentLoopConfig,
    tk: Any,
    action_to_message: Callable,
    feedback_to_message: Callable,
    tool_call_to_action: Callable,
    step: Callable[[Any, Action], Feedback] = lambda env, action: env.step(action),
) -> bool:
    """Record one sampled turn, act on it, append the feedback; True when the episode has ended."""
    ep.input_tokens += len(ep.ids)
    ep.versions.append(out.weight_version)
    if out.finish_reason == "abort":
        ep.infra = f"engine aborted the request: {out.error}"
        ep.finish_reason = "infra"
        return True
    sampled = list(out.token_ids)
    ep.ids += sampled
    ep.mask += [1] * len(sampled)
    ep.logprobs += list(out.logprobs)
    ep.output_tokens += len(sampled)
    ep.turns += 1
    text = tokenizer.decode(sampled)
    if not sampled or sampled[-1] != im_end:
        # Close the turn as the template would; the closing token was not sampled (mask 0).
        ep.ids.append(im_end)
        ep.mask.append(0)
        ep.logprobs.append(0.0)
    parsed = tk.parse_tool_calls(text)
    raw = text
    if parsed.errors:
        ep.parse_errors += 1
        err = parsed.errors[0]
        action = Action(kind="tool_call", name=parsed.calls[0].name if parsed.calls else "", raw=raw)
        fb = Feedback.error(
            ErrorCode.INVALID_ARGUMENTS,
            f"Your tool call could not be parsed ({err.kind}): {err.message}",
            call_id=f"call_{ep.turns}_0",
            hint=PARSE_HINT,
        )
        ep.steps.append(Step(action=action, feedback=fb))
        ep.messages.append({"role": "assistant", "content": _strip_end(text)})
        new_messages = [feedback_to_message(fb)]
    elif parsed.calls:
        # tool_call_to_action also maps a `delegate` call to a delegate Action (envs/render.py).
        actions = [
            tool_call_to_action({"function": {"name": c.name, "arguments": dict(c.arguments)}, "id": f"call_{ep.turns}_{j}"}, raw=raw)
            for j, c in enumerate(parsed.calls)
        ]
        msg = action_to_message(actions)
        if parsed.content and not msg.get("content"):
            msg["content"] = parsed.content
        if parsed.reasoning is not None and "reasoning_content" not in msg:
            msg["reasoning_content"] = parsed.reasoning
        ep.messages.append(msg)
        new_messages = []
        for action in actions:
            ep.tool_calls += 1
            try:
                fb = step(ep.env, action)
            except Exception as e:  # noqa: BLE001 - an env crash is the world's fault
                ep.steps.append(Step(action=action, feedback=Feedback.error(ErrorCode.INFRA, f"{type(e).__name__}: {e}", action.call_id)))
                ep.infra = f"env.step raised {type(e).__name__}: {e}"
                ep.finish_reason = "infra"
                return True
            ep.steps.append(Step(action=action, feedback=fb))
            if fb.is_infra:
                ep.infra = f"env returned {ErrorCode(fb.error_code).value}: {fb.message}"
                ep.finish_reason = "infra"
                return True
            new_messages.append(feedback_to_message(fb))
    else:
        # Plain text: a message to the user, which ends the episode.
        action = Action.message(parsed.content, raw=raw)
        ep.messages.append(parsed.to_message())
        try:
            fb = step(ep.env, action)
        except Exception as e:  # noqa: BLE001
            ep.steps.append(Step(action=action, feedback=None))
            ep.infra = f"env.step raised {type(e).__name__}: {e}"
            ep.finish_reason = "infra"
            return True
        ep.steps.append(Step(action=action, feedback=fb))
        if fb is not None and fb.is_infra:
            ep.infra = f"env returned {ErrorCode(fb.error_code).value}: {fb.message}"
            ep.finish_reason = "infra"
            return True
        if fb is None or fb.ok:
            ep.finish_reason = "answer"
            return True
        # The env refused the message (e.g. empty text): show the error and let the model go on.
        new_messages = [feedback_to_message(fb)]
    if ep.turns >= cfg.max_turns:
        ep.finish_reason = "max_turns"
        return True
    ids = tk.append_messages(tokenizer, ep.ids, _render_copy(ep.messages), new_messages, ep.tools)
    ep.messages += [dict(m) for m in new_messages]
    if len(ids) >= cfg.max_total_tokens:
        # No room for another turn: the feedback stays in `steps`/`messages` but not in the tokens,
        # so an episode never exceeds max_total_tokens.
        ep.finish_reason = "max_tokens"
        return True
    added = len(ids) - len(ep.ids)
    ep.ids = ids
    ep.mask += [0] * added
    ep.logprobs += [0.0] * added
    return False


def _strip_end(text: str) -> str:
    for end in ("<|im_end|>", "<|endoftext|>"):
        if text.endswith(end):
            return text[: -len(end)]
    return text


def _to_trajectory(ep: _Episode, cfg: AgentLoopConfig, engine: Any) -> Trajectory:
    verification: Verification | None = None
    if ep.infra:
        verification = Verification(success=False, score=0.0, infra_error=True)
    elif ep.env is not None:
        try:
            verification = ep.env.verify()
        except Exception as e:  # noqa: BLE001 - a verifier crash is infra, never a zero reward
            ep.infra = f"verify raised {type(e).__name__}: {e}"
            ep.finish_reason = "infra"
            verification = Verification(success=False, score=0.0, infra_error=True)
    task = ep.task
    versions = list(dict.fromkeys(ep.versions))
    return Trajectory(
        task_id=task.id,
        tokens=ep.ids,
        loss_mask=ep.mask,
        logprobs=ep.logprobs,
        steps=ep.steps,
        verification=verification,
        costs={
            "output_tokens": float(ep.output_tokens),
            "input_tokens": float(ep.input_tokens),
            "tool_calls": float(ep.tool_calls),
            "turns": float(ep.turns),
            "parse_errors": float(ep.parse_errors),
            "wall_s": time.perf_counter() - ep.t0,
            "device_s": ep.device_s,
        },
        provenance={
            "task": task.id,
            "domain": task.domain,
            "category": task.category,
            "template": task.template,
            "split": task.split,
            "env": cfg.env_kind,
            "planner": cfg.planner,
            "engine": type(engine).__name__,
            "weight_version": versions[-1] if versions else getattr(engine, "weight_version", ""),
            "weight_versions": versions,
            "harness_version": cfg.harness_version,
            "seed": cfg.seed,
            "temperature": cfg.temperature,
            "infra_reason": ep.infra,
        },
        messages=ep.messages,
        finish_reason=ep.finish_reason,
        infra_failure=bool(ep.infra),
    )


def summarize(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """Success and score overall, by domain and by category (infra failures counted apart, not scored)."""
    trajs = list(trajectories)
    scored = [t for t in trajs if not t.infra_failure and t.verification is not None]

    def block(items: list[Trajectory]) -> dict[str, Any]:
        n = len(items)
        succ = sum(1 for t in items if t.verification and t.verification.success)
        score = sum(float(t.verification.score) for t in items if t.verification)
        return {"n": n, "success": succ, "success_rate": succ / n if n else 0.0, "mean_score": score / n if n else 0.0}

    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    by_category: dict[str, list[Trajectory]] = defaultdict(list)
    for t in scored:
        by_domain[str(t.provenance.get("domain", "?"))].append(t)
        by_category[str(t.provenance.get("category", "?"))].append(t)
    out = block(scored)
    n_all = len(trajs) or 1
    out.update(
        episodes=len(trajs),
        infra_failures=len(trajs) - len(scored),
        by_domain={k: block(v) for k, v in sorted(by_domain.items())},
        by_category={k: block(v) for k, v in sorted(by_category.items())},
        finish_reasons=dict(sorted(Counter(t.finish_reason for t in trajs).items())),
        mean_output_tokens=sum(t.costs.get("output_tokens", 0.0) for t in trajs) / n_all,
        mean_input_tokens=sum(t.costs.get("input_tokens", 0.0) for t in trajs) / n_all,
        mean_tool_calls=sum(t.costs.get("tool_calls", 0.0) for t in trajs) / n_all,
        mean_turns=sum(t.costs.get("turns", 0.0) for t in trajs) / n_all,
        parse_error_turns=int(sum(t.costs.get("parse_errors", 0.0) for t in trajs)),
    )
    return out
