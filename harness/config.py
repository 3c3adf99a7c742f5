"""The harness settings (`config.harness`) as a typed, validated dataclass; a bad value names its key.

`harness.mcp` is a list of MCP server entries, each kept apart from the others (never joined and split
again). An entry is a dict `{"command": [...] or "CMD ARGS", "name": ..., "prefix": ..., "rename":
{old: new}, "allow": [...]}`, or one string: a command split like a shell would (never run through one),
optionally led by options, `"prefix=calc_ rename=calculate:calc name=calc allow=a,b python srv.py"`, or a
JSON object of the dict form (for commands awkward to quote).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import Any, Mapping

HARNESS_VERSION = "0.1.0"  # the built-in harness; approved evolution steps write versions above it
DEFAULT_MAX_RESULT_CHARS = 16_000  # ~4,000 tokens: a provider's answer beyond it is cut (harness/results.py)
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the OpenAI tools format (and so every planner) accepts
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY_OPTIONS = ("name", "prefix", "rename", "allow", "env")


class HarnessConfigError(ValueError):
    """A `config.harness` value is invalid; the message names the key."""


@dataclasses.dataclass
class MCPServerSpec:
    """One MCP server to start: its argv and how its tools are shown to the planner.

    `prefix` is put before every tool name; `rename` maps a tool's own name to the name the planner sees
    (it wins over the prefix for that tool). Calls arrive under the shown name and reach the server under
    its own. `allow` (None = the session's `mcp_allow`) lists the tools the planner may call, by either
    name. `log` is the file the server's stderr is appended to ("" = kept only for error messages);
    `max_result_chars` caps each answer (0 = no cap). `env` names the environment variables the server may
    read from ours beyond `harness.mcp.BASE_ENV` (its process gets no others; docs/harness.md).
    """

    command: list[str]
    name: str = ""
    prefix: str = ""
    rename: dict[str, str] = dataclasses.field(default_factory=dict)
    allow: set[str] | None = None
    log: str = ""
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    env: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"config.harness.mcp entry {' '.join(self.command)!r}"
        bad = [n for n in self.env if not ENV_NAME.match(str(n))]
        if bad:
            raise HarnessConfigError(f"{where}: env {bad[0]!r} is not an environment variable name")
        if not self.command or not all(isinstance(w, str) and w for w in self.command):
            raise HarnessConfigError(f"config.harness.mcp: an entry needs a command (non-empty strings), got {self.command!r}")
        if self.prefix and not TOOL_NAME.match(self.prefix):
            raise HarnessConfigError(f"{where}: prefix {self.prefix!r} may use only letters, digits, '_' and '-'")
        for old, new in self.rename.items():
            if not isinstance(old, str) or not isinstance(new, str) or not TOOL_NAME.match(new):
                raise HarnessConfigError(f"{where}: rename {old!r} -> {new!r}: the new name must be 1-64 letters,"
                                         " digits, '_' or '-'")

    def shown_name(self, tool: str) -> str:
        """The name the planner sees for the server's tool `tool`."""
        return self.rename.get(tool) or f"{self.prefix}{tool}"


def parse_mcp_entry(entry: Any, log: str = "", max_result_chars: int = DEFAULT_MAX_RESULT_CHARS) -> MCPServerSpec:
    """One `harness.mcp` entry (a dict, a JSON object string or an option-led command string) as a spec."""
    if isinstance(entry, MCPServerSpec):
        return dataclasses.replace(entry, log=entry.log or log)
    if hasattr(entry, "to_dict"):  # an ml_collections ConfigDict
        entry = entry.to_dict()
    if isinstance(entry, str) and entry.lstrip().startswith("{"):
        try:
            entry = json.loads(entry)
        except json.JSONDecodeError as e:
            raise HarnessConfigError(f"config.harness.mcp: entry {entry.strip()!r} is not a JSON object: {e}") from None
    if isinstance(entry, str):
        try:
            words = shlex.split(entry)
        except ValueError as e:
            raise HarnessConfigError(f"config.harness.mcp: cannot split {entry.strip()!r}: {e}") from None
        opts: dict[str, Any] = {}
        while words and "=" in words[0] and words[0].split("=", 1)[0] in _ENTRY_OPTIONS:
            key, value = words.pop(0).split("=", 1)
            opts[key] = value
        entry = {"command": words, **opts}
    if not isinstance(entry, Mapping):
        raise HarnessConfigError(f"config.harness.mcp: an entry must be a command string or a dict, got {entry!r}")
    unknown = sorted(set(entry) - {"command", *_ENTRY_OPTIONS})
    if unknown:
        raise HarnessConfigError(f"config.harness.mcp: unknown entry key {unknown[0]!r} (keys: command, {', '.join(_ENTRY_OPTIONS)})")
    if "*" in str(entry.get("env") or ""):
        raise HarnessConfigError("config.harness.mcp: env names variables one by one (a server never gets our whole environment)")
    command = entry.get("command")
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as e:
            raise HarnessConfigError(f"config.harness.mcp: cannot split {command!r}: {e}") from None
    return MCPServerSpec(command=list(command or []), name=str(entry.get("name") or ""), prefix=str(entry.get("prefix") or ""),
                         rename=_rename(entry.get("rename")), allow=_names(entry.get("allow")), log=log,
                         env=tuple(sorted(_names(entry.get("env")) or ())),
                         max_result_chars=max_result_chars)


def _rename(value: Any) -> dict[str, str]:
    """`{old: new}` or "old:new,old2:new2"."""
    if value in (None, ""):
        return {}
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    pairs = {}
    for part in str(value).split(","):
        old, sep, new = part.strip().partition(":")
        if not sep or not old or not new:
            raise HarnessConfigError(f"config.harness.mcp: rename {part.strip()!r} must be OLD:NEW")
        pairs[old] = new
    return pairs


def _names(value: Any) -> set[str] | None:
    """A comma-separated string or a list of tool names; None (all allowed) for nothing or "*"."""
    if value in (None, ""):
        return None
    names = {n.strip() for n in (value.split(",") if isinstance(value, str) else value) if str(n).strip()}
    return None if "*" in names else names


@dataclasses.dataclass
class HarnessConfig:
    """`config.harness` typed. No defaults of its own: `from_config` takes every value from a config (a missing key
    is an error naming it) and `defaults(**kw)` reads configs/tiny.py's section (tests, library use)."""

    enabled: bool
    tools: str
    top_k: int
    normalise: bool
    skills: bool
    skills_dir: str
    max_skills: int
    context_tokens: int
    subagents: bool
    subagent_turns: int
    store: str
    root: str
    version_dir: str
    mcp: list[Any]
    mcp_allow: str
    mcp_timeout_s: float
    mcp_log: str
    max_result_chars: int
    memory: bool
    memory_store: str
    memory_tokens: int
    review_policy: str

    def __post_init__(self) -> None:
        if self.tools not in ("task", "catalog"):
            raise HarnessConfigError(f"config.harness.tools must be 'task' or 'catalog', got {self.tools!r}")
        for key in ("top_k", "max_skills", "context_tokens", "subagent_turns", "memory_tokens"):
            if int(getattr(self, key)) < (0 if key == "max_skills" else 1):
                raise HarnessConfigError(f"config.harness.{key} must be positive, got {getattr(self, key)!r}")
        if self.review_policy not in ("manual", "auto"):
            raise HarnessConfigError(f"config.harness.review.policy must be 'manual' or 'auto', got {self.review_policy!r}")
        if not self.mcp_timeout_s > 0:
            raise HarnessConfigError(f"config.harness.mcp_timeout_s must be > 0, got {self.mcp_timeout_s!r}")
        if int(self.max_result_chars) < 0:
            raise HarnessConfigError(f"config.harness.max_result_chars must be >= 0 (0 = no cap), got {self.max_result_chars!r}")
        if isinstance(self.mcp, str):  # one command (a config written before the list): never split on ";"
            self.mcp = [self.mcp] if self.mcp.strip() else []
        elif isinstance(self.mcp, (list, tuple)):
            self.mcp = list(self.mcp)
        else:
            raise HarnessConfigError(f"config.harness.mcp must be a list of server entries, got {self.mcp!r}")
        self.mcp_servers  # noqa: B018 - parse now, so that a bad entry fails at load time and names itself

    @property
    def mcp_servers(self) -> list[MCPServerSpec]:
        """The MCP servers to start, one spec per `harness.mcp` entry (stderr to `mcp_log`, results capped)."""
        return [parse_mcp_entry(e, self.mcp_log, int(self.max_result_chars)) for e in self.mcp
                if not (isinstance(e, str) and not e.strip())]

    @property
    def mcp_commands(self) -> list[MCPServerSpec]:
        """The same as `mcp_servers` (the name `HarnessSession` reads; `start_servers` takes both forms)."""
        return self.mcp_servers

    @property
    def mcp_allowed(self) -> set[str] | None:
        """None = every MCP tool is allowed."""
        names = {n.strip() for n in self.mcp_allow.split(",") if n.strip()}
        return None if "*" in names else names

    @classmethod
    def defaults(cls, **overrides: Any) -> "HarnessConfig":
        """configs/tiny.py's `harness` section, with `overrides` (tests, library use, a session without a config)."""
        from mpa_jax.config import load_config_file

        return dataclasses.replace(cls.from_config(load_config_file("tiny")), **overrides)

    @classmethod
    def from_config(cls, config: Any) -> "HarnessConfig":
        """From a full experiment config (its `harness` section) or the section itself. Every key is required
        (a missing one is an error naming it); `review.policy` is the `review_policy` field."""
        section = config["harness"] if "harness" in config else config
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "review_policy":
                if "review" not in section or "policy" not in section["review"]:
                    raise HarnessConfigError("config.harness.review.policy is missing")
                kw[f.name] = str(section["review"]["policy"])
                continue
            if f.name not in section:
                raise HarnessConfigError(f"config.harness.{f.name} is missing")
            if f.name in section:
                value = section[f.name]
                if f.name == "mcp":  # a list of entries (or, from an older config, one command string)
                    kw[f.name] = list(value) if isinstance(value, (list, tuple)) else value
                    continue
                try:
                    kind = _TYPES[str(f.type)]
                    kw[f.name] = _bool(value, f.name) if kind is bool else kind(value)
                except (TypeError, ValueError):
                    raise HarnessConfigError(f"config.harness.{f.name}: cannot use {value!r}") from None
        unknown = sorted(set(section.keys()) - {f.name for f in dataclasses.fields(cls)} - {"review"})
        if unknown:
            raise HarnessConfigError(f"unknown config key: harness.{unknown[0]}")
        return cls(**kw)


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}  # the fields' annotations (postponed: strings)


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise HarnessConfigError(f"config.harness.{key} must be true or false, got {value!r}")
