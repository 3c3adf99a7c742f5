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
  `max_total_tokens` (the last turn is cut to fit, its closing `<|im_end|>` included; feedback that
  would not fit is kept in `steps` and `messages` but not in the tokens, so
  `len(tokens) <= max_total_tokens` always, except for an episode whose first prompt alone leaves
  no room: it ends at once as "infra" holding just that prompt).
- "output_errors": `max_output_errors` (> 0) malformed turns were answered with error Feedback (below);
  a model that cannot form a reply stops spending tokens on the task.
- "infra": the env answered INFRA/TIMEOUT, raised, or the engine failed (an error, an abort, or a
  token id the tokenizer cannot decode); `infra_failure` is set and the Verification carries
  `infra_error` (DESIGN §7: such episodes never become rewards).

Model output never crashes the loop. A turn that is not a well-formed reply gets one error Feedback
(`INVALID_ARGUMENTS`, a message naming what was wrong and a hint with the expected format) shown to
the model as a tool turn, and the episode goes on (until its turn or token limit). The kinds, counted
per episode in `provenance["output_errors"]` and in the summary:

- "parse_error": a tool call that does not parse (bad JSON, unclosed tag, ...);
- "cut_turn": the turn reached `max_new_tokens` before `<|im_end|>` (a runaway turn);
- "control_token": a ChatML control token (`<|endoftext|>`, `<|im_start|>`, ...) anywhere but as the
  turn's final `<|im_end|>`, sampled or spelled out in text;
- "invalid_utf8": the sampled bytes do not decode as UTF-8 (U+FFFD in the text);
- "undecodable_token": an id outside the tokenizer (only a misconfigured engine can produce one; the
  episode ends as "infra").

Generation stops only on `<|im_end|>`, the one token the chat template ends an assistant turn with, so
the token stream is always the template's rendering of what was sampled. A turn that did not end with
it (cut) is closed by appending `<|im_end|>` with mask 0 and log-prob 0. The token bookkeeping is
`tokenizer.chat.ChatSession`'s.
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
    max_output_errors: int = 0  # end the episode after this many malformed turns; 0 = only the turn/token limits

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
            max_output_errors=int(rollout_cfg.get("max_output_errors", 0) or 0),
        )
        kw.update(overrides)
        return cls(**kw)


@dataclasses.dataclass
class _Episode:
    index: int
    task: Task
    env: Any = None
    session: Any = None  # tokenizer.chat.ChatSession: ids, loss mask, log-probs and messages
    steps: list[Step] = dataclasses.field(default_factory=list)
    turns: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    output_errors: Counter = dataclasses.field(default_factory=Counter)
    device_s: float = 0.0
    t0: float = 0.0
    versions: list[str] = dataclasses.field(default_factory=list)
    finish_reason: str = ""
    infra: str = ""  # non-empty: why the episode is an infra failure

    @property
    def ids(self) -> list[int]:
        return self.session.ids if self.session is not None else []


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
    stop_ids = (im_end,)  # the template ends every assistant turn with it (module docstring)
    controls = _control_tokens(tokenizer, im_end)
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
            ep.session = tk.ChatSession(tokenizer, obs["messages"], list(obs.get("tools") or []) or None)
        except Exception as e:  # noqa: BLE001 - a broken env/task is an infra failure, not a crash
            ep.infra = f"reset failed: {type(e).__name__}: {e}"
            finish(ep, "infra")
            return None
        if len(ep.ids) >= cfg.max_total_tokens:
            # Not the policy's fault and nothing to sample: never scored (kept for inspection).
            ep.infra = f"the first prompt has {len(ep.ids)} tokens, no room under max_total_tokens={cfg.max_total_tokens}"
            finish(ep, "infra")
            return None
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
            # One token stays free for the <|im_end|> that closes a cut turn.
            budget = min(cfg.max_new_tokens, cfg.max_total_tokens - len(ep.ids) - 1)
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
                try:
                    return _after_generate(ep, out, tokenizer, controls, cfg, action_to_message, feedback_to_message,
                                           tool_call_to_action, step)
                except Exception as e:  # noqa: BLE001 - a bug on one episode must not lose the others
                    ep.infra = f"agent loop error: {type(e).__name__}: {e}"
                    ep.finish_reason = "infra"
                    return True

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


def _control_tokens(tokenizer: Any, im_end: int) -> dict[int, str]:
    """Id -> text of the tokenizer's control (special) tokens; `<|im_end|>` included."""
    ids = set(getattr(tokenizer, "special_ids", set())) | {im_end}
    return {i: tokenizer.id_to_token(i) for i in sorted(ids)}


def _malformed(out: GenerateResult, sampled: list[int], text: str, controls: dict[int, str], im_end: int) -> tuple[str, str]:
    """(kind, message) when the turn is not a well-formed reply (see the module docstring), else ("", "")."""
    body = sampled[:-1] if sampled[-1] == im_end else sampled
    bad = next((controls[t] for t in body if t in controls), None)
    if bad is None:
        body_text = text[: -len(controls[im_end])] if sampled[-1] == im_end and text.endswith(controls[im_end]) else text
        bad = next((c for c in controls.values() if c in body_text), None)
    if bad is not None:
        return "control_token", f"Your reply contains the control token {bad}; end a reply only with {controls[im_end]}."
    if out.finish_reason == "length" or sampled[-1] != im_end:
        return "cut_turn", f"Your reply was cut off after {len(sampled)} tokens before it ended; keep replies short."
    if "\ufffd" in text:
        return "invalid_utf8", "Your reply is not valid UTF-8 text."
    return "", ""


def _after_generate(
    ep: _Episode,
    out: GenerateResult,
    tokenizer: Any,
    controls: dict[int, str],
    cfg: AgentLoopConfig,
    action_to_message: Callable,
    feedback_to_message: Callable,
    tool_call_to_action: Callable,
    step: Callable[[Any, Action], Feedback] = lambda env, action: env.step(action),
) -> bool:
    """Record one sampled turn, act on it, append the feedback; True when the episode has ended."""
    session = ep.session
    im_end = session.im_end
    ep.input_tokens += len(session.ids)
    ep.versions.append(out.weight_version)
    if out.finish_reason == "abort":
        ep.infra = f"engine aborted the request: {out.error}"
        ep.finish_reason = "infra"
        return True
    sampled = list(out.token_ids)
    bad_id = next((t for t in sampled if not 0 <= t < tokenizer.vocab_size), None)
    if bad_id is not None:
        # Only an engine sampling past the tokenizer can do this (make_engine(tokenizer=) prevents it).
        ep.output_errors["undecodable_token"] += 1
        ep.infra = f"engine returned token id {bad_id}, outside the tokenizer's {tokenizer.vocab_size} ids"
        ep.finish_reason = "infra"
        return True
    ep.turns += 1
    call_id = f"call_{ep.turns}_0"
    if not sampled:
        kind, problem = "cut_turn", "Your reply was empty."
        text = ""
        session.close_turn()
        session.messages.append({"role": "assistant", "content": ""})
    else:
        parsed = session.add_sampled(sampled, out.logprobs)
        ep.output_tokens += len(sampled)
        session.close_turn()
        text = tokenizer.decode(sampled)
        kind, problem = _malformed(out, sampled, text, controls, im_end)
    raw = text
    if not kind and parsed.errors:
        kind = "parse_error"
        ep.parse_errors += 1
        err = parsed.errors[0]
        problem = f"Your tool call could not be parsed ({err.kind}): {err.message}"
    if kind:
        ep.output_errors[kind] += 1
        name = parsed.calls[0].name if sampled and parsed.calls else ""
        action = Action(kind="tool_call", name=name, raw=raw)
        fb = Feedback.error(ErrorCode.INVALID_ARGUMENTS, problem, call_id=call_id, hint=PARSE_HINT)
        ep.steps.append(Step(action=action, feedback=fb))
        # The raw text (not a parsed message): what was sampled is what the chat holds.
        session.messages[-1] = {"role": "assistant", "content": _strip_end(text)}
        new_messages = [feedback_to_message(fb)]
        if cfg.max_output_errors > 0 and sum(ep.output_errors.values()) >= cfg.max_output_errors:
            ep.finish_reason = "output_errors"
            return True
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
        session.messages[-1] = msg
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
    ids = session.render_messages(new_messages)
    if len(session.ids) + len(ids) >= cfg.max_total_tokens:
        # No room for another turn: the feedback stays in `steps`/`messages` but not in the tokens,
        # so an episode never exceeds max_total_tokens.
        session.messages += [dict(m) for m in new_messages]
        ep.finish_reason = "max_tokens"
        return True
    session.add_messages(new_messages, ids=ids)
    return False


def _strip_end(text: str) -> str:
    return text[: -len("<|im_end|>")] if text.endswith("<|im_end|>") else text


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
        tokens=list(ep.ids),
        loss_mask=list(ep.session.loss_mask) if ep.session is not None else [],
        logprobs=list(ep.session.logprobs) if ep.session is not None else [],
        steps=ep.steps,
        verification=verification,
        costs={
            "output_tokens": float(ep.output_tokens),
            "input_tokens": float(ep.input_tokens),
            "tool_calls": float(ep.tool_calls),
            "turns": float(ep.turns),
            "parse_errors": float(ep.parse_errors),
            "malformed_turns": float(sum(ep.output_errors.values())),
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
            "output_errors": dict(sorted(ep.output_errors.items())),
        },
        messages=ep.session.messages if ep.session is not None else [],
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
        output_errors=dict(sorted(sum((Counter(t.provenance.get("output_errors") or {}) for t in trajs), Counter()).items())),
    )
    return out
