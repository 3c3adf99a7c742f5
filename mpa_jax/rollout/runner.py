"""`EpisodeRunner`: the one place episodes run, token-in/token-out, for every command.

Evaluation, policy data collection, the SFT success hook, RL, the demo and the loop all run their episodes
through it. Built once from the config (`EpisodeRunner.from_config(config)`), it owns

- the envs: a task-aware factory (`EnvFactory`: a task's kind is `task.metadata["env"]` (simulated tasks
  say so), a kind given per task to `run`, else `config.envs.kind`), built from `config.envs.<kind>` with
  the run's context format (`envs.context.ContextFormat`, passed explicitly);
- the `EnvPool` with per-kind concurrency and timeouts (`config.envs.<kind>`), and a cap on live episodes
  per kind (one per ADB device);
- the harness session when `config.harness.enabled` (the harness presents itself as the env, DESIGN §5).

Per episode: `env.reset(task)` gives the first messages and tool schemas; the prompt is rendered with the
chat template; then, until the episode ends,

    generate -> append the sampled ids as sampled (mask 1, behaviour log-probs) -> turn them into a
    `envs.episode.Reply` -> the episode rules (`envs.episode.Episode`: parse error -> Feedback,
    infra ends the episode, plain text is the answer or, in a conversation, gets the user's next turn) ->
    render the feedback turn(s) or the user turn with the chat template (a user message) and the next
    generation prompt and append them (mask 0) -> repeat. `costs["user_turns"]` counts the user's follow-ups.

What the token level adds to the rules (Trajectory.finish_reason):
- "max_tokens": the episode reached `max_total_tokens` (the last turn is cut to fit, its closing
  `<|im_end|>` included; feedback that would not fit is kept in `steps` and `messages` but not in the
  tokens, so `len(tokens) <= max_total_tokens` always, except for an episode whose first prompt alone
  leaves no room: it ends at once as "infra" holding just that prompt);
- malformed turns, besides parse errors: "cut_turn" (the turn reached `max_new_tokens` before
  `<|im_end|>`, or was empty), "control_token" (a ChatML control token anywhere but as the turn's final
  `<|im_end|>`, sampled or spelled out), "invalid_utf8" (U+FFFD in the decoded text); counted per episode
  in `provenance["output_errors"]`;
- infra: the engine reported a fault (`EngineError`, an abort), returned an id outside the tokenizer
  ("undecodable_token") or a non-finite log-prob (NaN/inf: nothing partial is rewarded), or the env
  reported one (INFRA/TIMEOUT Feedback, `envs.base.EnvFault`, a pool timeout) at set-up, reset, step or
  verify; `infra_failure` is set and the Verification carries `infra_error`. Any other exception is a bug:
  it fails the run with its traceback and a note naming the episode (RL would otherwise drop it silently).

Generation stops only on `<|im_end|>`, the one token the chat template ends an assistant turn with; a
turn that did not end with it is closed by appending `<|im_end|>` with mask 0 and log-prob 0
(`tokenizer.chat.ChatSession` keeps the token bookkeeping).

Scheduling (`EpisodeConfig.schedule`, `config.rollout.schedule`): "continuous" gives a streaming engine
(`rollout.types.StreamingEngine`: the embedded engine's `submit(prompt_ids, params, seed) -> Future`) each
episode's next turn as soon as its feedback is ready; "rounds", and every engine without `submit` (SGLang,
test doubles), get one `generate` call per distinct token budget per round of all live episodes (each a batch
on an idle engine: bitwise reproducible, which RL's exact resume needs). Sampling seeds are per (episode,
turn), so the schedule changes what is sampled only by float rounding (~1e-7 on log-probs).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import time
from collections import defaultdict
from typing import Any, Callable, Sequence

from mpa_jax.envs.context import ContextFormat
from mpa_jax.envs.contract import Feedback, Task, Trajectory, Verification
from mpa_jax import seeds
from mpa_jax.envs.pool import EnvPool, KindLimits, limits_from_config
from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.episode import Episode, Reply
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams


@dataclasses.dataclass
class EpisodeConfig:
    """Limits and sampling of one `run`: `from_config(config.rollout)`, or `defaults(**overrides)` (configs/tiny.py's
    rollout section, the one source of defaults, for tests and benches)."""

    max_turns: int
    max_new_tokens: int
    max_total_tokens: int
    temperature: float
    top_p: float
    top_k: int
    batch_size: int  # live episodes at once
    seed: int
    max_output_errors: int  # end the episode after this many malformed turns; 0 = only the turn/token limits
    # "continuous": a streaming engine gets each episode's next turn as soon as it is ready (fastest);
    # "rounds": one generate call per token budget per round (each batch on an idle engine: bitwise
    # reproducible, what RL's exact resume needs). Engines without `submit` always run rounds.
    schedule: str
    planner: str = "policy"  # the provenance label of the episodes (not a config knob)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_total_tokens", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EpisodeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.schedule not in ("continuous", "rounds"):
            raise ValueError(f"config.rollout.schedule must be 'continuous' or 'rounds', got {self.schedule!r}")

    @classmethod
    def from_config(cls, rollout_cfg: Any, seed: int = 0, greedy: bool = False, **overrides: Any) -> "EpisodeConfig":
        """From the `config.rollout` section; `greedy` forces temperature 0 (evaluation)."""
        kw = dict(
            max_turns=int(rollout_cfg.max_turns),
            max_new_tokens=int(rollout_cfg.max_new_tokens),
            max_total_tokens=int(rollout_cfg.max_total_tokens),
            temperature=0.0 if greedy else float(rollout_cfg.temperature),
            top_p=float(rollout_cfg.top_p),
            top_k=int(rollout_cfg.top_k),
            batch_size=int(rollout_cfg.batch_size),
            seed=int(seed),
            max_output_errors=int(rollout_cfg.max_output_errors),
            schedule=str(rollout_cfg.schedule),
        )
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def defaults(cls, **overrides: Any) -> "EpisodeConfig":
        """configs/tiny.py's `rollout` section and seed, with `overrides` (tests, benches, `run` without a config)."""
        from mpa_jax.config import load_config_file

        tiny = load_config_file("tiny")
        return cls.from_config(tiny.rollout, seed=int(overrides.pop("seed", tiny.seed)), **overrides)


def episode_seed(base: int, task_id: str, sample: int, turn: int) -> int:
    """The sampling seed of one turn of sample `sample` of task `task_id` under `base`: the `sampling` stream over
    the task's `episode` seed (`mpa_jax.seeds`), so it never depends on the task's place in the run's list."""
    return seeds.derive("sampling", seeds.derive("episode", base, seeds.task_key(task_id), sample), turn)


class EnvFactory:
    """Fresh envs by kind: kwargs from `config.envs.<kind>` (none without a config) and the context format."""

    def __init__(self, config: Any = None, *, default_kind: str | None = None, context: ContextFormat | None = None,
                 make: Callable[[str], Any] | None = None) -> None:
        self.config = config
        self.default_kind = default_kind or (str(config.envs.kind) if config is not None else "sandbox")
        self.context = context or (ContextFormat.from_config(config) if config is not None else ContextFormat())
        self._make = make

    def kind_for(self, task: Task) -> str:
        """A task's env kind: the one it names (`metadata["env"]`: simulated tasks), else the default."""
        return str(task.metadata.get("env") or self.default_kind)

    def __call__(self, kind: str) -> Any:
        if self._make is not None:
            return self._make(kind)
        from mpa_jax.envs import make_env

        env = make_env(kind, config=self.config, context=self.context)
        if self.config is not None and self.config.security.enabled:  # the injection defense (docs/security.md)
            from mpa_jax.harness.security.guard import GuardedEnv, SecurityConfig

            env = GuardedEnv(env, SecurityConfig.from_config(self.config))
        return env


@dataclasses.dataclass
class _Live:
    """One running episode: its env, rules and token stream."""

    index: int
    task: Task
    kind: str
    sample: int = 0  # the seed's sample index (mpa_jax.seeds): distinguishes the episodes of one task in one run
    env: Any = None
    session: Any = None  # tokenizer.chat.ChatSession: ids, loss mask, log-probs and messages
    rules: Episode | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    device_s: float = 0.0
    t0: float = 0.0
    versions: list[str] = dataclasses.field(default_factory=list)
    finish_reason: str = ""
    infra: str = ""

    @property
    def ids(self) -> list[int]:
        return self.session.ids if self.session is not None else []

    def end(self, reason: str, infra: str = "") -> None:
        if self.rules is not None:
            self.rules.end(reason, infra)
        self.finish_reason = self.finish_reason or reason
        if infra and not self.infra:
            self.infra, self.finish_reason = infra, "infra"


class EpisodeRunner:
    """Runs episodes of many tasks at once (see the module docstring). Use as a context manager or `close()`."""

    def __init__(self, envs: EnvFactory | None = None, *, pool: EnvPool | None = None, harness: Any = None,
                 max_live: dict[str, int] | None = None) -> None:
        self.envs = envs or EnvFactory()
        # No pool given (tests, benches with their own env class): every kind inline; configs go through from_config.
        self.pool = pool if pool is not None else EnvPool(default=KindLimits(0, 30.0))
        self.harness = harness
        self.max_live = {"adb": 1, **(max_live or {})}  # a device holds one episode at a time

    @classmethod
    def from_config(cls, config: Any, *, harness: bool | None = None, harness_version_dir: str = "",
                    kind: str | None = None) -> "EpisodeRunner":
        """The runner a config describes: `config.envs` (kinds, limits), `config.context`, `config.harness`
        (`harness` overrides `config.harness.enabled`; `harness_version_dir` the version it runs under)."""
        session = None
        if config.harness.enabled if harness is None else harness:
            from mpa_jax.harness.config import HarnessConfig
            from mpa_jax.harness.runtime import HarnessSession

            hcfg = HarnessConfig.from_config(config)
            hcfg = dataclasses.replace(hcfg, enabled=True, version_dir=harness_version_dir or hcfg.version_dir)
            session = HarnessSession(hcfg)
        return cls(EnvFactory(config, default_kind=kind), pool=EnvPool(limits_from_config(config)), harness=session)

    @classmethod
    def from_sections(cls, *, envs: Any, context: Any, harness: Any, security: Any) -> "EpisodeRunner":
        """`from_config` from the sections it reads: `config.envs`, `config.context`, `config.harness`,
        `config.security` (the RL trainer passes these, not the whole config)."""
        import ml_collections

        return cls.from_config(ml_collections.ConfigDict({"envs": envs, "context": context, "harness": harness,
                                                          "security": security}))

    @property
    def harness_version(self) -> str:
        return self.harness.version_label if self.harness is not None else "none"

    def close(self) -> None:
        """Close the harness session and the env pool."""
        if self.harness is not None:
            self.harness.close()
        self.pool.close()

    def __enter__(self) -> "EpisodeRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the run
    def run(self, engine: Any, tokenizer: Any, tasks: Sequence[Task], cfg: EpisodeConfig | None = None, *,
            kinds: Sequence[str] | None = None, on_done: Callable[[Trajectory], None] | None = None,
            samples: Sequence[int] | None = None) -> list[Trajectory]:
        """One episode per task (results in task order). `kinds[i]` overrides task i's env kind; `samples[i]` is
        episode i's sample index, its seed's key with the task id (default: the task id's occurrence count so far
        in `tasks`, `mpa_jax.seeds.occurrences`); `on_done` is called as each episode finishes (progress bars,
        streaming writes)."""
        cfg = cfg or EpisodeConfig.defaults()
        if kinds is not None and len(kinds) != len(tasks):
            raise ValueError(f"EpisodeRunner.run: {len(kinds)} kinds for {len(tasks)} tasks")
        if samples is not None and len(samples) != len(tasks):
            raise ValueError(f"EpisodeRunner.run: {len(samples)} samples for {len(tasks)} tasks")
        if self.harness is not None and self.harness.cfg.subagents and self.harness.subplanner is None:
            from mpa_jax.harness.planners import EnginePlanner

            self.harness.subplanner = EnginePlanner(engine, tokenizer, cfg.max_new_tokens, cfg.temperature, params_cls=SamplingParams,
                                                   engine_errors=(EngineError,))
        tasks = list(tasks)
        run = _Run(self, engine, tokenizer, tasks, cfg, list(kinds) if kinds is not None else None, on_done,
                   [int(s) for s in samples] if samples is not None else seeds.occurrences(t.id for t in tasks))
        return run.go()


class _Run:
    """The state of one `EpisodeRunner.run` call."""

    def __init__(self, runner: EpisodeRunner, engine: Any, tokenizer: Any, tasks: list[Task], cfg: EpisodeConfig,
                 kinds: list[str] | None, on_done: Callable[[Trajectory], None] | None, samples: list[int]) -> None:
        self.r, self.engine, self.tok, self.tasks, self.cfg, self.on_done = runner, engine, tokenizer, tasks, cfg, on_done
        self.samples = samples
        self.kinds = kinds or [runner.envs.kind_for(t) for t in tasks]
        self.pool = runner.pool
        self.im_end = tokenizer.token_id("<|im_end|>")
        ids = set(getattr(tokenizer, "special_ids", set())) | {self.im_end}
        self.controls = {i: tokenizer.id_to_token(i) for i in sorted(ids)}
        self.queue = list(range(len(tasks)))[::-1]
        self.live: list[_Live] = []
        self.in_flight: dict[str, int] = defaultdict(int)
        self.results: dict[int, Trajectory] = {}

    def go(self) -> list[Trajectory]:
        from mpa_jax.rollout.types import StreamingEngine

        if self.cfg.schedule == "continuous" and isinstance(self.engine, StreamingEngine):
            self._continuous()
        else:
            self._rounds()
        return [self.results[i] for i in range(len(self.tasks))]

    # ------------------------------------------------------------------ scheduling
    def _admit(self) -> None:
        """Start queued episodes while there is room (overall and per kind)."""
        waiting: list[int] = []
        while self.queue and len(self.live) < self.cfg.batch_size:
            i = self.queue.pop()
            kind = self.kinds[i]
            if self.in_flight[kind] >= self.r.max_live.get(kind, self.cfg.batch_size):
                waiting.append(i)
                continue
            ep = self._start(i, kind)
            if ep is not None:
                self.live.append(ep)
        self.queue += waiting[::-1]

    def _budget(self, ep: _Live) -> int:
        # one token stays free for the <|im_end|> that closes a cut turn
        return min(self.cfg.max_new_tokens, self.cfg.max_total_tokens - len(ep.ids) - 1)

    def _params(self, budget: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=budget, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                              top_k=self.cfg.top_k, stop_token_ids=(self.im_end,))

    def _inline(self, ep: _Live) -> bool:
        return self.pool.limit(self.pool.kind_of(ep.env)).concurrency == 0

    def _rounds(self) -> None:
        """Round-synchronous: every live episode's turn in one engine call per token budget."""
        while self.queue or self.live:
            self._admit()
            if not self.live:
                if self.queue:  # only kinds at their live cap are queued, and nothing runs: cannot happen
                    raise RuntimeError("EpisodeRunner: queued episodes but none can start")
                continue
            groups: dict[int, list[_Live]] = defaultdict(list)
            for ep in list(self.live):
                budget = self._budget(ep)
                if budget < 1:
                    self._finish(ep, "max_tokens")
                    continue
                groups[budget].append(ep)
            for budget, eps in groups.items():
                t0 = time.perf_counter()
                try:
                    outs = self.engine.generate([ep.ids for ep in eps], self._params(budget),
                                                [episode_seed(self.cfg.seed, ep.task.id, ep.sample, ep.rules.turns) for ep in eps])
                except EngineError as e:
                    for ep in eps:
                        self._finish(ep, "infra", f"engine error: {e}")
                    continue
                share = (time.perf_counter() - t0) / len(eps)
                # every episode of the round acts at once (one slow env never holds up the others); kinds the
                # pool runs inline (the sandbox) stay in this thread
                if all(self._inline(ep) for ep in eps):
                    ended = [self._turn(ep, out, share) for ep, out in zip(eps, outs)]
                else:
                    with cf.ThreadPoolExecutor(len(eps), thread_name_prefix="episode") as ex:
                        ended = list(ex.map(self._turn, eps, outs, [share] * len(eps)))
                for ep, done in zip(eps, ended):
                    if done:
                        self._finish(ep, ep.rules.finish_reason or ep.finish_reason)

    def _continuous(self) -> None:
        """Continuous batching: each episode's next turn is submitted as soon as its feedback is ready."""
        generating: dict[cf.Future, tuple[_Live, float]] = {}  # request -> (episode, engine seconds charged to it)
        acting: dict[cf.Future, _Live] = {}
        last = time.perf_counter()
        workers = cf.ThreadPoolExecutor(max(1, self.cfg.batch_size), thread_name_prefix="episode")

        def submit(ep: _Live) -> None:
            budget = self._budget(ep)
            if budget < 1:
                self._finish(ep, "max_tokens")
                return
            try:
                fut = self.engine.submit(ep.ids, self._params(budget), episode_seed(self.cfg.seed, ep.task.id, ep.sample, ep.rules.turns),
                                         updates=False)  # only the result: no per-token stream
            except EngineError as e:
                self._finish(ep, "infra", f"engine error: {e}")
                return
            generating[fut] = (ep, 0.0)

        def acted(ep: _Live, done: bool) -> None:
            if done:
                self._finish(ep, ep.rules.finish_reason or ep.finish_reason)
            else:
                submit(ep)

        try:
            while True:
                before = {id(ep) for ep in self.live}
                self._admit()
                for ep in self.live:
                    if id(ep) not in before:
                        submit(ep)
                if not generating and not acting:
                    if self.queue or self.live:
                        continue
                    break
                done, _ = cf.wait(list(generating) + list(acting), return_when=cf.FIRST_COMPLETED)
                # the engine's time since the last event is shared by the requests it served meanwhile (as a
                # round's call time is shared by its rows), not each request's own queue-and-decode latency
                now = time.perf_counter()
                if generating:
                    each = (now - last) / len(generating)
                    generating.update({f: (e, s + each) for f, (e, s) in generating.items()})
                last = now
                for fut in done:
                    if fut in acting:
                        ep = acting.pop(fut)
                        acted(ep, fut.result())
                        continue
                    ep, dt = generating.pop(fut)
                    try:
                        out = fut.result()
                    except EngineError as e:
                        self._finish(ep, "infra", f"engine error: {e}")
                        continue
                    if self._inline(ep):
                        acted(ep, self._turn(ep, out, dt))
                    else:
                        acting[workers.submit(self._turn, ep, out, dt)] = ep
        finally:
            workers.shutdown(wait=True)

    # ------------------------------------------------------------------ one episode
    def _start(self, index: int, kind: str) -> _Live | None:
        from mpa_jax import tokenizer as tk

        task = self.tasks[index]
        ep = _Live(index=index, task=task, kind=kind, sample=self.samples[index], t0=time.perf_counter())
        self.in_flight[kind] += 1
        try:
            ep.env = self.r.envs(kind)
            if self.r.harness is not None:
                from mpa_jax.harness.runtime import HarnessEnv

                ep.env = HarnessEnv(ep.env, self.r.harness)
        except EnvFault as e:  # the env says the world is down (a device lost): infra; anything else is a bug
            self._finish(ep, "infra", f"env set-up failed: {type(e).__name__}: {e}")
            return None
        ep.rules = Episode(task, lambda a, env=ep.env: self.pool.step_all([(env, a)])[0], max_turns=self.cfg.max_turns,
                           max_output_errors=self.cfg.max_output_errors)
        (obs,) = self._env_call(ep, lambda: ep.env.reset(task))
        if isinstance(obs, Feedback):  # the pool answers a failed reset with INFRA/TIMEOUT Feedback
            self._finish(ep, "infra", f"reset failed: {obs.message}")
            return None
        ep.session = tk.ChatSession(self.tok, obs["messages"], list(obs.get("tools") or []) or None)
        if len(ep.ids) >= self.cfg.max_total_tokens:
            # not the policy's fault and nothing to sample: never scored (kept for inspection)
            self._finish(ep, "infra", f"the first prompt has {len(ep.ids)} tokens, no room under "
                                      f"max_total_tokens={self.cfg.max_total_tokens}")
            return None
        return ep

    def _turn(self, ep: _Live, out: GenerateResult, device_s: float) -> bool:
        """Record one sampled turn, act on it, append the feedback; True when the episode has ended. An
        exception here is a bug (infra comes as EngineError, an abort or INFRA/TIMEOUT Feedback): it fails the
        run, with a note naming the episode."""
        try:
            return self._act(ep, out, device_s)
        except Exception as e:
            raise _noted(e, ep)

    def _env_call(self, ep: _Live, fn: Callable[[], Any]) -> list[Any]:
        """`fn` (a reset or verify) through the pool; a bug it raises carries a note naming the episode."""
        try:
            return self.pool.call_all([(ep.env, fn, "")])
        except Exception as e:
            raise _noted(e, ep)

    def _act(self, ep: _Live, out: GenerateResult, device_s: float) -> bool:
        session, rules = ep.session, ep.rules
        ep.device_s += device_s
        ep.input_tokens += len(session.ids)
        ep.versions.append(out.weight_version)
        if out.finish_reason == "abort":
            ep.end("infra", f"engine aborted the request: {out.error}")
            return True
        sampled = list(out.token_ids)
        bad_id = next((t for t in sampled if not 0 <= t < self.tok.vocab_size), None)
        if bad_id is not None:
            # only an engine sampling past the tokenizer can do this (make_engine(tokenizer=) prevents it)
            rules.output_errors["undecodable_token"] += 1
            ep.end("infra", f"engine returned token id {bad_id}, outside the tokenizer's {self.tok.vocab_size} ids")
            return True
        bad_lp = next(((i, lp) for i, lp in enumerate(out.logprobs) if not math.isfinite(float(lp))), None)
        if bad_lp is not None:
            # a diverged policy, a bf16 overflow or a broken backend: nothing of this episode may become a reward
            ep.end("infra", f"engine returned a non-finite log-prob ({bad_lp[1]}) for token {bad_lp[0]} of turn {rules.turns + 1}")
            return True
        if not sampled:
            reply = Reply(malformed="cut_turn", problem="Your reply was empty.")
            session.close_turn()
            session.messages.append({"role": "assistant", "content": ""})
        else:
            parsed = session.add_sampled(sampled, out.logprobs)
            ep.output_tokens += len(sampled)
            session.close_turn()
            text = self.tok.decode(sampled)
            kind, problem = _malformed(out, sampled, text, self.controls, self.im_end)
            if not kind and parsed.errors:
                err = parsed.errors[0]
                kind, problem = "parse_error", f"Your tool call could not be parsed ({err.kind}): {err.message}"
            reply = Reply(content=parsed.content, reasoning=parsed.reasoning, malformed=kind, problem=problem, raw=text,
                          calls=[{"name": c.name, "arguments": dict(c.arguments)} for c in parsed.calls])
        msg, shown = rules.act(reply)
        if msg is not None:
            session.messages[-1] = msg
        if rules.ended:
            return True
        ids = session.render_messages(shown)
        if len(session.ids) + len(ids) >= self.cfg.max_total_tokens:
            # no room for another turn: the feedback stays in `steps`/`messages` but not in the tokens
            session.messages += [dict(m) for m in shown]
            ep.end("max_tokens")
            return True
        session.add_messages(shown, ids=ids)
        return False

    def _finish(self, ep: _Live, reason: str, infra: str = "") -> None:
        ep.end(reason, infra)
        if ep.rules is not None and ep.rules.infra and not ep.infra:  # the rules ended it as infra
            ep.infra, ep.finish_reason = ep.rules.infra, "infra"
        if ep in self.live:
            self.live.remove(ep)
        verification: Verification | None = None
        if ep.infra:
            verification = Verification(success=False, score=0.0, infra_error=True)
        elif ep.env is not None:
            (v,) = self._env_call(ep, ep.env.verify)
            if isinstance(v, Verification):
                verification = v
            else:  # a verifier crash or timeout is infra, never a zero reward
                ep.end("infra", f"verify failed: {getattr(v, 'message', v)}")
                verification = Verification(success=False, score=0.0, infra_error=True)
        traj = self._trajectory(ep, verification)
        if ep.env is not None:
            try:
                ep.env.close()
            except EnvFault:  # a device gone at close: the trajectory is kept
                pass
            self.pool.release(ep.env)
        self.in_flight[ep.kind] -= 1
        if self.r.harness is not None:
            self.r.harness.annotate(traj)
        self.results[ep.index] = traj
        if self.on_done is not None:
            self.on_done(traj)

    def _trajectory(self, ep: _Live, verification: Verification | None) -> Trajectory:
        task, rules, session = ep.task, ep.rules, ep.session
        versions = list(dict.fromkeys(ep.versions))
        errors = rules.output_errors if rules is not None else {}
        return Trajectory(
            task_id=task.id,
            tokens=list(ep.ids),
            loss_mask=list(session.loss_mask) if session is not None else [],
            logprobs=list(session.logprobs) if session is not None else [],
            steps=list(rules.steps) if rules is not None else [],
            verification=verification,
            costs={
                "output_tokens": float(ep.output_tokens),
                "input_tokens": float(ep.input_tokens),
                "tool_calls": float(rules.tool_calls if rules is not None else 0),
                "turns": float(rules.turns if rules is not None else 0),
                "user_turns": float(rules.user_turns if rules is not None else 0),
                "parse_errors": float(rules.parse_errors if rules is not None else 0),
                "malformed_turns": float(sum(errors.values())),
                "wall_s": time.perf_counter() - ep.t0,
                "device_s": ep.device_s,
            },
            provenance={
                "task": task.id,
                "domain": task.domain,
                "category": task.category,
                "template": task.template,
                "split": task.split,
                "env": self.pool.kind_of(ep.env) if ep.env is not None else ep.kind,
                "planner": self.cfg.planner,
                "engine": type(self.engine).__name__,
                "weight_version": versions[-1] if versions else str(getattr(self.engine, "weight_version", "")),
                "weight_versions": versions,
                "harness_version": self.r.harness_version,
                "seed": self.cfg.seed,
                "temperature": self.cfg.temperature,
                "infra_reason": ep.infra,
                "output_errors": dict(sorted(errors.items())),
            },
            messages=session.messages if session is not None else [],
            finish_reason=ep.finish_reason,
            infra_failure=bool(ep.infra),
        )


def _noted(e: BaseException, ep: _Live) -> BaseException:
    """`e` with a note naming its episode (a bug fails the run; the note says where)."""
    e.add_note(f"in episode {ep.index} (task {ep.task.id!r}, env {ep.kind!r}, turn {ep.rules.turns if ep.rules else 0})")
    return e


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


def run_episodes(engine: Any, tokenizer: Any, tasks: Sequence[Task], make_env: Callable[[], Any], cfg: EpisodeConfig | None = None,
                 *, pool: EnvPool | None = None, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """One `EpisodeRunner.run` over envs from `make_env()` (a fresh one per episode), for callers that bring
    their own env class (tests, benches); `pool` (default: every kind inline) sets the per-kind limits."""
    runner = EpisodeRunner(EnvFactory(make=lambda _kind: make_env()), pool=pool)
    try:
        return runner.run(engine, tokenizer, tasks, cfg, on_done=on_done)
    finally:
        if pool is None:
            runner.close()
