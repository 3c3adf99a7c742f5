"""The harness runtime: it sits between the planner and the env and presents itself to the agent loop
as an env (the same `reset / step / verify / close` protocol), so the loop needs no other seam.

    session = HarnessSession(HarnessConfig.defaults(enabled=True, tools="catalog"))
    env = session.env_factory()           # a HarnessEnv around a fresh sandbox
    obs = env.reset(task)                  # context: system prompt + skills (+ memory), tools, history in budget
    fb = env.step(action)                  # normalise -> validate -> route -> Feedback with a hint -> trace
    traj = ...; session.annotate(traj)     # harness version, per-agent tokens, sub-agent episodes

Per `reset`: the env's observation is rebuilt. Tools: the task's list (`tools = "task"`) or the top-k of
the whole catalog retrieved from the request and history (`"catalog"`), plus MCP and other provider
tools and `run_skill` when a retrieved skill has a macro; descriptions edited by an approved harness
version. The system prompt gets the relevant skills and, when a provider offers it, memory context.
Prior history is kept within `context_tokens` (the oldest turns are dropped, with a note).

Per `step`: a tool call is normalised against its schema (and approved rewrites), routed to the env
(its ledger stays the truth; the acting agent is kept on the Action), an MCP/other provider, a skill
macro or a sub-agent; every result is a Feedback whose error carries a hint; every step is recorded in
the trace store (one committed SQLite transaction each) when one is configured.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import uuid
from typing import Any, Callable, Iterable

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec, Trajectory
from mpa_jax.harness.config import HarnessConfig
from mpa_jax.envs.episode import Episode, PlannerReply, drive
from mpa_jax.harness.evolution import HarnessVersion, read_version
from mpa_jax.harness.grounding import ground_arguments
from mpa_jax.harness.normalise import normalise_arguments, schema_hint
from mpa_jax.harness.registry import SandboxTools, ToolProvider, ToolRegistry, unknown_tool_feedback
from mpa_jax.harness.skills import RUN_SKILL_SPEC, SHIPPED_DIR, SkillLibrary, run_macro, skills_prompt
from mpa_jax.harness.store import HarnessStore

# A hint for every error code the world can give, used when the tool gave none.
HINTS: dict[ErrorCode, str] = {
    ErrorCode.INVALID_ARGUMENTS: "fix the arguments to match the tool's parameters",
    ErrorCode.UNKNOWN_TOOL: "call one of the tools listed",
    ErrorCode.NOT_FOUND: "search for the item first and use the id the search returns",
    ErrorCode.AMBIGUOUS: "several items match: ask the user which one they mean",
    ErrorCode.PRECONDITION_FAILED: "fix what the message names (a setting or a missing step), then repeat the call",
    ErrorCode.UNSUPPORTED_VALUE: "this value is refused: use another spelling, unit or tool for the same result",
    ErrorCode.PERMISSION_DENIED: "this agent may not call that tool: delegate to the role that has it",
    ErrorCode.RATE_LIMITED: "too many calls: repeat the same call once",
    ErrorCode.TRANSIENT: "a temporary failure: repeat the same call once",
    ErrorCode.TIMEOUT: "the tool did not answer in time: repeat the call once",
    ErrorCode.INFRA: "the tool service failed (not your fault)",
}
TOKENS_PER_CHAR = 0.25  # context budgeting without a tokenizer: ~4 characters per token


def approx_tokens(message: dict[str, Any]) -> int:
    text = message.get("content") if isinstance(message.get("content"), str) else json.dumps(message.get("content"))
    return 4 + int(len(text or "") * TOKENS_PER_CHAR)


@dataclasses.dataclass
class SubagentRun:
    """One sub-agent's episode inside a planner episode: its own chat, steps and sampled tokens."""

    agent: str
    instruction: str
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # prompt_ids, token_ids, logprobs per turn
    output_tokens: int = 0
    prompt_tokens: int = 0
    answer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class HarnessSession:
    """Shared by every episode of a run: config, tool registry (sandbox + MCP + extra providers), skills,
    the approved version, the trace store and the sub-agent planner."""

    def __init__(self, cfg: HarnessConfig | None = None, *, env_factory: Callable[[], Any] | None = None,
                 providers: Iterable[ToolProvider] = (), subplanner: Any = None, store: HarnessStore | None = None,
                 count_tokens: Callable[[dict[str, Any]], int] | None = None, start_mcp: bool = True) -> None:
        self.cfg = cfg or HarnessConfig.defaults(enabled=True)
        self.version = read_version(self.cfg.version_dir) if self.cfg.version_dir else HarnessVersion()
        self.registry = ToolRegistry([SandboxTools()])
        self.extra: list[ToolProvider] = []
        if start_mcp and self.cfg.mcp_commands:
            from mpa_jax.harness.mcp import start_servers

            for p in start_servers(self.cfg.mcp_commands, self.cfg.mcp_allowed, self.cfg.mcp_timeout_s):
                self.add_provider(p)
        if self.cfg.memory:
            from mpa_jax.harness.memory import MemoryProvider

            self.add_provider(MemoryProvider.from_config(self.cfg))
        for p in providers:
            self.add_provider(p)
        dirs = [SHIPPED_DIR, self.cfg.skills_dir, self.version.skills_dir]
        self.skills = SkillLibrary(d for d in dirs if d)
        if self.cfg.store and store is None:
            store = HarnessStore(self.cfg.store)
        self.store = store
        self.subplanner = subplanner
        self.count_tokens = count_tokens or approx_tokens
        self._env_factory = env_factory
        self._runs: dict[str, list[dict[str, Any]]] = {}

    def add_provider(self, provider: ToolProvider) -> None:
        """Another tool source (MCP server, memory, ...); its tools are offered in every episode."""
        self.registry.add_provider(provider)
        self.extra.append(provider)

    @classmethod
    def from_config(cls, config: Any, **kw: Any) -> "HarnessSession":
        return cls(HarnessConfig.from_config(config), **kw)

    @property
    def version_label(self) -> str:
        return self.version.version

    def env_factory(self) -> "HarnessEnv":
        """A fresh HarnessEnv around a fresh env (the agent loop's `env_factory`)."""
        if self._env_factory is not None:
            inner = self._env_factory()
        else:
            from mpa_jax.envs import make_env

            inner = make_env("sandbox")
        return HarnessEnv(inner, self)

    def record(self, episode: str, agent: str, kind: str, payload: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.append(episode, agent, kind, payload)

    def _finished(self, task_id: str, info: dict[str, Any]) -> None:
        self._runs.setdefault(task_id, []).append(info)

    def annotate(self, traj: Trajectory) -> Trajectory:
        """Add the harness's part to a Trajectory the loop built: version, per-agent tokens and the
        sub-agent episodes (their sampled ids and log-probs, apart from the planner's)."""
        runs = self._runs.get(traj.task_id) or []
        info = runs.pop(0) if runs else {}
        traj.provenance["harness_version"] = self.version_label
        traj.provenance["harness"] = {k: v for k, v in info.items() if k != "subagents"}
        subs = info.get("subagents", [])
        agents = {"planner": {"output_tokens": float(traj.costs.get("output_tokens", 0.0))}}
        for s in subs:
            a = agents.setdefault(s["agent"], {"output_tokens": 0.0})
            a["output_tokens"] += float(s["output_tokens"])
        traj.provenance["agents"] = agents
        if subs:
            traj.provenance["subagent_episodes"] = subs
        return traj

    def close(self) -> None:
        self.registry.close()
        if self.store is not None:
            self.store.close()


class HarnessEnv:
    """The runtime for one episode, in the env protocol the agent loop speaks."""

    def __init__(self, env: Any, session: HarnessSession) -> None:
        self.env, self.session, self.cfg = env, session, session.cfg
        # The wrapped env's kind: env pools apply that kind's limits (the sandbox stays inline).
        self.kind = getattr(env, "kind", "sandbox")
        self.task: Task | None = None
        self.episode = ""
        self.offered: list[str] = []
        self.skills_used: list[str] = []
        self.subagents: list[SubagentRun] = []
        self.normalised = 0
        self.records = 0
        self._seen: list[str] = []  # what the episode has shown (prompt, tool results): grounded names
        self._request = ""  # the user's side of the conversation: where grounded names come from

    # ---------------------------------------------------------------- protocol
    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return self.env.tool_specs(task)

    def reset(self, task: Task) -> dict[str, Any]:
        obs = self.env.reset(task)
        self.task = task
        self.episode = f"{task.id}:{uuid.uuid4().hex[:10]}"
        self.subagents, self.normalised, self.records = [], 0, 0
        messages = [dict(m) for m in obs["messages"]]
        self._seen = [str(m.get("content") or "") for m in messages]
        self._request = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") != "system")
        from mpa_jax.harness.retrieval import catalog_index, request_query

        query = request_query(messages[1:])
        env_tools = list(obs.get("tools") or [])
        if self.cfg.tools == "catalog":
            names = catalog_index().search(query, self.cfg.top_k)
            reg = self.session.registry
            tools = [reg.spec(n).to_openai() for n in names if n in reg]
            tools += [t for t in env_tools if t["function"]["name"] == "delegate"]  # roles are the task's, not retrieval's
        else:
            tools = env_tools
        tools += [p_spec.to_openai() for p in self.session.extra for p_spec in p.specs()]
        skills = self.session.skills.retrieve(query, self.cfg.max_skills, [t["function"]["name"] for t in tools]) \
            if self.cfg.skills and self.cfg.max_skills else []
        if any(s.macro for s in skills):
            tools.append(RUN_SKILL_SPEC.to_openai())
        tools = [self._describe(t) for t in tools]
        self.offered = [t["function"]["name"] for t in tools]
        self.skills_used = [f"{s.name}@{s.version}" for s in skills]
        extra_system = [skills_prompt(skills)]
        for p in self.session.extra:
            ctx = getattr(p, "context", None)
            if callable(ctx):
                text = ctx(task, query)
                if text:
                    extra_system.append(str(text))
        extra = "\n\n".join(x for x in extra_system if x)
        if extra and messages and messages[0].get("role") == "system":
            messages[0]["content"] = messages[0]["content"] + "\n\n" + extra
        messages = self._budget(messages)
        self.session.record(self.episode, "harness", "reset", {
            "task": task.id, "tools": self.offered, "skills": self.skills_used, "harness_version": self.session.version_label,
            "mode": self.cfg.tools})
        return {"messages": messages, "tools": tools}

    def step(self, action: Any) -> Feedback:
        """Route one action; never raises for a bad action (a bug in a provider becomes INFRA)."""
        if not isinstance(action, Action):
            return self.env.step(action)
        agent = action.agent or "planner"
        self._record(agent, "action", {"action": action.to_dict()})
        try:
            fb = self._route(action)
        except Exception as e:  # noqa: BLE001 - the harness's own failure is the world's fault
            fb = Feedback.error(ErrorCode.INFRA, f"harness error: {type(e).__name__}: {e}", action.call_id)
        fb = self._with_hint(fb, action)
        self._saw(fb)
        self._record(agent, "feedback", {"call_id": action.call_id, "feedback": fb.to_dict()})
        for p in self.session.extra:  # e.g. memory: remember what happened (a provider's own choice)
            observe = getattr(p, "observe", None)
            if callable(observe):
                try:
                    observe(self.task, action, fb)
                except Exception:  # noqa: BLE001 - an observer must never break the episode
                    pass
        return fb

    def verify(self) -> Any:
        v = self.env.verify()
        self._record("harness", "verify", {"success": v.success, "score": v.score, "infra_error": v.infra_error})
        return v

    def close(self) -> None:
        if self.task is not None:
            self.session._finished(self.task.id, {
                "episode": self.episode, "mode": self.cfg.tools, "tools_offered": self.offered, "skills": self.skills_used,
                "normalised_calls": self.normalised, "subagents": [s.to_dict() for s in self.subagents]})
        self.env.close()

    # ---------------------------------------------------------------- context
    def _describe(self, tool: dict[str, Any]) -> dict[str, Any]:
        name = tool["function"]["name"]
        edit = self.session.version.descriptions.get(name)
        if not edit:
            return tool
        tool = copy.deepcopy(tool)
        tool["function"]["description"] = edit
        return tool

    def _budget(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Keep the system prompt and the request; drop the oldest history turns beyond the token budget."""
        if len(messages) <= 2:
            return messages
        head, history, last = messages[:1], messages[1:-1], messages[-1:]
        count = self.session.count_tokens
        budget = self.cfg.context_tokens
        kept: list[dict[str, Any]] = []
        used = 0
        for m in reversed(history):
            n = count(m)
            if used + n > budget:
                break
            kept.append(m)
            used += n
        kept.reverse()
        dropped = len(history) - len(kept)
        # A kept assistant turn needs the user turn before it; never start with an orphan tool turn.
        while kept and kept[0].get("role") in ("assistant", "tool"):
            kept.pop(0)
            dropped += 1
        if dropped:
            head = [dict(head[0])]
            head[0]["content"] += f"\n\n({dropped} earlier turns of this conversation are not shown.)"
        return head + kept + last

    # ---------------------------------------------------------------- routing
    def _route(self, action: Action) -> Feedback:
        if action.kind == "delegate" or (action.kind == "tool_call" and action.name == "delegate"
                                          and isinstance(action.arguments, dict) and self.task is not None and self.task.roles):
            if action.kind == "tool_call":
                action = Action(kind="delegate", name=str(action.arguments.get("agent", "")),
                                text=str(action.arguments.get("instruction", "")), call_id=action.call_id, raw=action.raw,
                                agent=action.agent)
            if self.cfg.subagents and self.session.subplanner is not None:
                return self._subagent(action)
            return self.env.step(action)
        if action.kind != "tool_call":
            return self.env.step(action)
        return self._call(action.name, action.arguments, action.call_id, action.agent, raw=action.raw)

    def _call(self, name: str, args: Any, call_id: str, agent: str, raw: str = "", allowed: set[str] | None = None) -> Feedback:
        reg = self.session.registry
        if allowed is not None and name not in allowed:
            return Feedback.error(ErrorCode.PERMISSION_DENIED, f"agent {agent!r} may not call {name}", call_id,
                                  "use only your own tools: " + ", ".join(sorted(allowed)))
        if name == "run_skill" and isinstance(args, dict):
            skill = self.session.skills.get(str(args.get("skill", "")))
            if skill is None:
                return Feedback.error(ErrorCode.NOT_FOUND, f"no skill named {args.get('skill')!r}", call_id,
                                      "skills: " + ", ".join(sorted(self.session.skills.skills)))
            params = args.get("params") or {}
            if not isinstance(params, dict):
                return Feedback.error(ErrorCode.INVALID_ARGUMENTS, "run_skill params must be an object", call_id)
            return run_macro(skill, params, lambda n, a, c: self._call(n, a, c, agent, allowed=allowed), call_id)
        if name in reg and self.cfg.normalise:
            new, changes = normalise_arguments(args, reg.spec(name).parameters, self.session.version.rewrites, name)
            if changes:
                self.normalised += 1
                self._record(agent, "normalise", {"tool": name, "changes": changes})
                args = new
            if self.session.version.grounding:
                new, changes = ground_arguments(args, name, self.session.version.grounding, "\n".join(self._seen), self._request)
                if changes:
                    self.normalised += 1
                    self._record(agent, "normalise", {"tool": name, "changes": changes})
                    args = new
        provider = reg.provider(name) if name in reg else None
        if provider is not None and provider.source != "sandbox":
            err = reg.validate(name, args)
            if err:
                return Feedback.error(ErrorCode.INVALID_ARGUMENTS, err, call_id, f"{name}: {schema_hint(reg.spec(name).parameters)}")
            fb = call_provider(provider, name, args, call_id)
            return fb
        return self.env.step(Action(kind="tool_call", name=name, arguments=args, call_id=call_id, raw=raw, agent=agent))

    def _saw(self, fb: Feedback | None) -> None:
        """A tool result the planner has now seen: names in it are grounded (harness/grounding.py)."""
        if fb is not None and fb.result is not None:
            self._seen.append(json.dumps(fb.result, ensure_ascii=False))

    def _with_hint(self, fb: Feedback, action: Action) -> Feedback:
        if fb is None or fb.ok or fb.error_code is None:
            return fb
        code = ErrorCode(fb.error_code)
        hint = fb.hint
        reg = self.session.registry
        if code == ErrorCode.UNKNOWN_TOOL and action.kind == "tool_call":
            sugg = reg.suggest(action.name, self.offered or None)
            if sugg:
                return dataclasses.replace(fb, hint=unknown_tool_feedback(action.name, fb.call_id, sugg).hint)
        if code == ErrorCode.INVALID_ARGUMENTS and action.kind == "tool_call" and action.name in reg:
            extra = f"{action.name}: {schema_hint(reg.spec(action.name).parameters)}"
            if extra not in (hint or ""):
                hint = f"{hint}; {extra}" if hint else extra
        if not hint:
            hint = HINTS.get(code, "")
        return dataclasses.replace(fb, hint=hint) if hint != fb.hint else fb

    def _record(self, agent: str, kind: str, payload: dict[str, Any]) -> None:
        if self.session.store is not None and self.episode:
            self.session.record(self.episode, agent, kind, payload)
            self.records += 1

    # ---------------------------------------------------------------- sub-agents
    def _subagent(self, action: Action) -> Feedback:
        """Hand the sub-task to a sub-agent: its own planner call(s), its own context, its role's tools."""
        role, instruction = action.name, action.text
        fb0 = self.env.step(action)  # the env checks the role and records the delegation in its ledger
        if not fb0.ok:
            return fb0
        allowed = set(self.task.roles.get(role, ())) if self.task is not None else set()
        reg = self.session.registry
        tools = [self._describe(reg.spec(n).to_openai()) for n in sorted(allowed) if n in reg]
        run = SubagentRun(agent=role, instruction=instruction)
        run.messages = [
            {"role": "system", "content": f"You are the {role} sub-agent of a phone assistant. Do only the sub-task you are given,"
                                          " with your own tools, then reply with a short plain-text result (the values found or"
                                          " what you did). Look up ids with the search tools before using them."},
            {"role": "user", "content": instruction},
        ]
        self.subagents.append(run)
        planner = self.session.subplanner

        def step(a: Action) -> Feedback:
            if a.kind != "tool_call":  # a delegate call: sub-agents act only with their own tools
                return Feedback.error(ErrorCode.PERMISSION_DENIED, f"sub-agent {role!r} may not delegate", a.call_id,
                                      "use only your own tools: " + ", ".join(sorted(allowed)))
            self._record(role, "action", {"action": a.to_dict()})
            fb = self._with_hint(self._call(a.name, a.arguments, a.call_id, role, allowed=allowed), a)
            self._saw(fb)
            self._record(role, "feedback", {"call_id": a.call_id, "feedback": fb.to_dict()})
            run.steps.append({"action": a.to_dict(), "feedback": fb.to_dict()})
            return fb

        ep = Episode(self.task, step, max_turns=self.cfg.subagent_turns, agent=role, answer_to_env=False,
                     make_call_id=lambda turn, j: f"{action.call_id}.{turn - 1}.{j}")

        def seen(reply: PlannerReply) -> None:
            run.output_tokens += reply.output_tokens
            run.prompt_tokens += reply.prompt_tokens
            run.turns.append({"prompt_ids": reply.prompt_ids, "token_ids": reply.token_ids, "logprobs": reply.logprobs})
            self._record(role, "planner", {"turn": ep.turns, "text": reply.text, "calls": reply.calls,
                                           "error": reply.error.to_dict() if reply.error else None})

        drive(planner, ep, run.messages, tools, seen)  # the one chat-level driver, sub-agents included
        if ep.finish_reason == "answer":
            run.answer = ep.answer or ""
            return Feedback(call_id=action.call_id, status="ok",
                            result={"agent": role, "answer": run.answer, "tool_calls": len(run.steps)},
                            cost={"subagent_output_tokens": float(run.output_tokens),
                                  "subagent_prompt_tokens": float(run.prompt_tokens)})
        if ep.infra:
            return Feedback.error(ErrorCode.INFRA, f"sub-agent {role}: {ep.infra}", action.call_id)
        return Feedback.error(ErrorCode.PRECONDITION_FAILED, f"sub-agent {role} did not finish within {self.cfg.subagent_turns} turns",
                              action.call_id, "give the sub-agent a smaller, clearer sub-task")


def call_provider(provider: ToolProvider, name: str, args: Any, call_id: str, max_chars: int | None = None) -> Feedback:
    """One provider call as Feedback: a provider bug is INFRA; the answer is cut to `max_chars` characters
    (default: the provider's `max_result_chars`, else harness.config.DEFAULT_MAX_RESULT_CHARS; 0 = no cap)."""
    import inspect

    from mpa_jax.harness.config import DEFAULT_MAX_RESULT_CHARS
    from mpa_jax.harness.results import cap_result

    try:
        takes_id = "call_id" in inspect.signature(provider.call).parameters
    except (TypeError, ValueError):
        takes_id = False
    try:
        fb = provider.call(name, args, call_id) if takes_id else provider.call(name, args)  # type: ignore[call-arg]
    except Exception as e:  # noqa: BLE001 - a provider bug is INFRA, never a crash of the episode
        return Feedback.error(ErrorCode.INFRA, f"{provider.source} failed: {type(e).__name__}: {e}", call_id)
    if not fb.call_id:
        fb = dataclasses.replace(fb, call_id=call_id)
    if max_chars is None:
        own = getattr(provider, "max_result_chars", None)
        max_chars = DEFAULT_MAX_RESULT_CHARS if own is None else int(own)
    return cap_result(fb, max_chars)


def version_of(path: str) -> str:
    """The version label of a harness version directory (its manifest), for provenance."""
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        return str(json.load(f)["version"])
