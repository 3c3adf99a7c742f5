"""The action-feedback-verification contract shared by every stage (DESIGN §3).

Plain, JSON-serialisable, versioned dataclasses. No jax, no numpy: this module runs on actor hosts
and devices. Every class has `to_dict()` / `from_dict()`; `from_dict` ignores nothing silently:
unknown keys raise `ContractError` naming the key, so a producer/consumer version skew is loud.

Versions: a record is version 1 (`SCHEMA_VERSION`) unless it uses a later feature. Version 2
(`CONVERSATION_VERSION`) adds conversations: a Feedback with `user_turn` (the env answers the planner's text
reply with the user's next message; the episode goes on until a reply gets none) is version 2 and its JSON
carries the key; a Feedback without one writes exactly the version-1 JSON, so every pinned digest and cache
of single-request data stays as it was. Tasks may also carry the categories of external benchmarks
(`BENCHMARK_CATEGORIES`).
"""
from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Literal, Mapping, TypeVar

SCHEMA_VERSION = 1
CONVERSATION_VERSION = 2  # Feedback.user_turn

DOMAINS: tuple[str, ...] = (
    "communication",
    "contacts",
    "calendar_reminders",
    "clock_alarms",
    "notes_files",
    "navigation_rides",
    "shopping_food",
    "payments_banking",
    "travel",
    "health_fitness",
    "media",
    "device_settings",
    "utilities",
)
# "followup": conversations, the user speaks again after the reply (envs/taskgen/followup.py)
CATEGORIES: tuple[str, ...] = ("tool_use", "memory", "skills", "subagent", "followup")
# Categories of external benchmarks run as env kinds (`envs/bfcl`, `envs/agentdojo`): each reports per its own
# category, as the benchmark does (BFCL v4 multi-turn's four; AgentDojo's four suites).
BENCHMARK_CATEGORIES: tuple[str, ...] = (
    "bfcl_base", "bfcl_miss_func", "bfcl_miss_param", "bfcl_long_context",
    "agentdojo_workspace", "agentdojo_travel", "agentdojo_banking", "agentdojo_slack",
)
SPLITS: tuple[str, ...] = ("train", "dev", "test")


class ContractError(ValueError):
    """A contract object could not be built from the given data; the message names the field."""


class ErrorCode(str, enum.Enum):
    """Typed error codes of a Feedback. INFRA and TIMEOUT are the world's fault, not the policy's."""

    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    NOT_FOUND = "NOT_FOUND"
    AMBIGUOUS = "AMBIGUOUS"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    UNSUPPORTED_VALUE = "UNSUPPORTED_VALUE"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RATE_LIMITED = "RATE_LIMITED"
    TRANSIENT = "TRANSIENT"
    TIMEOUT = "TIMEOUT"
    INFRA = "INFRA"

    @property
    def is_infra(self) -> bool:
        """True for errors that must never become rewards (DESIGN §7)."""
        return self in (ErrorCode.INFRA, ErrorCode.TIMEOUT)


T = TypeVar("T", bound="_Record")


class _Record:
    """Mixin: dict/JSON round trip for the dataclasses below."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            out[f.name] = _encode(getattr(self, f.name))
        return out

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        if not isinstance(data, Mapping):
            raise ContractError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ContractError(f"{cls.__name__}: unknown field {unknown[0]!r}")
        kwargs = {}
        for name, value in data.items():
            kwargs[name] = cls._decode_field(name, value)
        try:
            return cls(**kwargs)
        except TypeError as e:  # missing required field
            raise ContractError(f"{cls.__name__}: {e}") from None

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))

    @classmethod
    def _decode_field(cls, name: str, value: Any) -> Any:
        return value


def _encode(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 kept; the form every hash is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _sorted_keys(obj: Any, keep_key: str | None = None, keep: bool = False) -> Any:
    """`obj` with every object's keys sorted, except below a key named `keep_key` (its order is kept)."""
    if isinstance(obj, dict):
        items = obj.items() if keep else sorted(obj.items())
        return {k: _sorted_keys(v, keep_key, keep or k == keep_key) for k, v in items}
    if isinstance(obj, list):
        return [_sorted_keys(v, keep_key, keep) for v in obj]
    return obj


@dataclasses.dataclass
class ToolSpec(_Record):
    """A tool the planner may call. `parameters` is a JSON Schema object with additionalProperties false."""

    name: str
    app: str
    domain: str
    description: str
    parameters: dict[str, Any]
    returns: dict[str, Any] = dataclasses.field(default_factory=lambda: {"type": "object"})
    kind: Literal["read", "write"] = "read"
    preconditions: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_openai(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {...}}` form chat templates and OpenAI APIs take."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclasses.dataclass
class Task(_Record):
    """An executable task. `gold` is never shown to the planner."""

    id: str
    domain: str
    category: str
    difficulty: int
    instruction: str
    tools: list[str]
    verifier: dict[str, Any]
    gold: list[dict[str, Any]]
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    roles: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # sub-agent allow-lists
    initial_state: dict[str, Any] = dataclasses.field(default_factory=dict)  # patch over the persona world
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    template: str = ""
    split: str = "train"
    seed: int = 0
    persona_seed: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        """Canonical JSON, except that gold tool-call arguments keep their order (the schema's, as generated):
        a task read back from a cache or JSONL demonstrates its calls exactly as a freshly generated one.
        Hashes of a task's content use `canonical_json(task.to_dict())`, which ignores that order."""
        d = {k: _sorted_keys(v, "arguments" if k == "gold" else None) for k, v in sorted(self.to_dict().items())}
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ContractError(f"Task {self.id}: unknown domain {self.domain!r}")
        if self.category not in CATEGORIES and self.category not in BENCHMARK_CATEGORIES:
            raise ContractError(f"Task {self.id}: unknown category {self.category!r}")
        if self.split not in SPLITS:
            raise ContractError(f"Task {self.id}: unknown split {self.split!r}")


ActionKind = Literal["tool_call", "message", "delegate", "finish"]


@dataclasses.dataclass
class Action(_Record):
    """What the planner did. `raw` keeps the model text the action was parsed from."""

    kind: ActionKind
    name: str = ""  # tool name (tool_call) or sub-agent name (delegate)
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    call_id: str = ""
    text: str = ""  # message text, or delegate instruction
    raw: str = ""
    agent: str = "planner"
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def tool_call(cls, name: str, arguments: dict[str, Any], call_id: str = "", raw: str = "", agent: str = "planner") -> "Action":
        return cls(kind="tool_call", name=name, arguments=arguments, call_id=call_id, raw=raw, agent=agent)

    @classmethod
    def message(cls, text: str, raw: str = "", agent: str = "planner") -> "Action":
        return cls(kind="message", text=text, raw=raw, agent=agent)

    @classmethod
    def delegate(cls, subagent: str, instruction: str, raw: str = "", agent: str = "planner") -> "Action":
        return cls(kind="delegate", name=subagent, text=instruction, raw=raw, agent=agent)

    @classmethod
    def finish(cls, raw: str = "", agent: str = "planner") -> "Action":
        return cls(kind="finish", raw=raw, agent=agent)


@dataclasses.dataclass
class Feedback(_Record):
    """What the world answered to one Action.

    `user_turn` (conversations, version 2): to a `message` Action, an env may answer ok with the user's next
    message; the episode then goes on with it as a user turn. An answer without one (the default, and every
    version-1 env) ends the conversation.
    """

    call_id: str
    status: Literal["ok", "error"]
    error_code: ErrorCode | None = None
    message: str = ""
    hint: str = ""
    result: Any = None
    cost: dict[str, float] = dataclasses.field(default_factory=dict)
    user_turn: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __post_init__(self) -> None:
        if self.user_turn and self.schema_version < CONVERSATION_VERSION:
            self.schema_version = CONVERSATION_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if not self.user_turn:  # version-1 bytes for single-request data
            d.pop("user_turn")
        return d

    @property
    def conversation_over(self) -> bool:
        """False when this answer carries the user's next turn (the episode goes on)."""
        return not (self.status == "ok" and self.user_turn)

    @classmethod
    def next_user_turn(cls, text: str, call_id: str = "", result: Any = None) -> "Feedback":
        """The env's answer to a planner's message when the user speaks again (`text` must be non-empty)."""
        if not text:
            raise ContractError("Feedback.next_user_turn: the user's next turn is empty")
        return cls(call_id=call_id, status="ok", result=result, user_turn=text)

    @property
    def is_infra(self) -> bool:
        return self.error_code is not None and ErrorCode(self.error_code).is_infra

    @classmethod
    def error(cls, code: ErrorCode, message: str, call_id: str = "", hint: str = "") -> "Feedback":
        return cls(call_id=call_id, status="error", error_code=code, message=message, hint=hint)

    @classmethod
    def _decode_field(cls, name: str, value: Any) -> Any:
        if name == "error_code" and value is not None:
            try:
                return ErrorCode(value)
            except ValueError:
                raise ContractError(f"Feedback: unknown error_code {value!r}") from None
        return value


@dataclasses.dataclass
class Check(_Record):
    """One named verification check."""

    name: str
    passed: bool
    detail: str = ""
    weight: float = 1.0


@dataclasses.dataclass
class Verification(_Record):
    """The verdict on an episode: state-first checks, a success flag and a score in [0, 1]."""

    success: bool
    score: float
    checks: list[Check] = dataclasses.field(default_factory=list)
    infra_error: bool = False
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def _decode_field(cls, name: str, value: Any) -> Any:
        if name == "checks":
            return [Check.from_dict(c) for c in value]
        return value


@dataclasses.dataclass
class Step(_Record):
    """One Action and the Feedback it received (Feedback is None for a final message or finish).

    In a conversation the planner's message that the env answered with the user's next turn is the step
    whose Feedback has `user_turn` set: `Trajectory.user_turns()` lists them."""

    action: Action
    feedback: Feedback | None = None

    @classmethod
    def _decode_field(cls, name: str, value: Any) -> Any:
        if name == "action":
            return Action.from_dict(value)
        if name == "feedback" and value is not None:
            return Feedback.from_dict(value)
        return value


@dataclasses.dataclass
class Trajectory(_Record):
    """The training unit (DESIGN §3).

    `tokens` are the ids of the whole episode, `loss_mask[i]` is 1 where the model sampled `tokens[i]`
    and 0 on prompt, tool and environment tokens; `logprobs[i]` is the behaviour log-prob of a sampled
    token (0.0 where the mask is 0). Sampled tokens are kept exactly as sampled, never re-tokenised.
    """

    task_id: str
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    steps: list[Step]
    verification: Verification | None = None
    costs: dict[str, float] = dataclasses.field(default_factory=dict)  # output_tokens, input_tokens, tool_calls, wall_s, device_s
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)  # task, env kind, planner, weight version, harness version
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the chat, for text-level SFT data
    finish_reason: str = ""
    infra_failure: bool = False
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ContractError(
                f"Trajectory {self.task_id}: tokens ({n}), loss_mask ({len(self.loss_mask)}) and logprobs"
                f" ({len(self.logprobs)}) must have the same length"
            )

    def user_turns(self) -> list[str]:
        """The user's follow-up turns of a conversation, in order (the first request is not one of them)."""
        return [s.feedback.user_turn for s in self.steps if s.feedback is not None and s.feedback.user_turn]

    @classmethod
    def _decode_field(cls, name: str, value: Any) -> Any:
        if name == "steps":
            return [Step.from_dict(s) for s in value]
        if name == "verification" and value is not None:
            return Verification.from_dict(value)
        return value


def read_jsonl(path: str, cls: type[T]) -> list[T]:
    """Read one contract object per line; a bad line raises ContractError naming file and line."""
    out: list[T] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(cls.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ContractError) as e:
                raise ContractError(f"{path}:{lineno}: {e}") from None
    return out


def write_jsonl(path: str, items: list[_Record]) -> None:
    """Write one canonical JSON object per line."""
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(item.to_json() + "\n")
