"""The harness settings (`config.harness`) as a typed, validated dataclass; a bad value names its key."""
from __future__ import annotations

import dataclasses
import shlex
from typing import Any

HARNESS_VERSION = "0.1.0"  # the built-in harness; approved evolution steps write versions above it


class HarnessConfigError(ValueError):
    """A `config.harness` value is invalid; the message names the key."""


@dataclasses.dataclass
class HarnessConfig:
    enabled: bool = False
    tools: str = "task"
    top_k: int = 8
    normalise: bool = True
    skills: bool = True
    skills_dir: str = ""
    max_skills: int = 2
    context_tokens: int = 3000
    subagents: bool = False
    subagent_turns: int = 6
    store: str = ""
    root: str = "runs/harness"
    version_dir: str = ""
    mcp: str = ""
    mcp_allow: str = "*"
    mcp_timeout_s: float = 20.0
    memory: bool = False
    memory_store: str = ""
    memory_tokens: int = 512
    review_policy: str = "manual"

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

    @property
    def mcp_commands(self) -> list[list[str]]:
        """The MCP server commands, each split like a shell would (never run through a shell)."""
        out = []
        for part in self.mcp.split(";"):
            if part.strip():
                try:
                    out.append(shlex.split(part))
                except ValueError as e:
                    raise HarnessConfigError(f"config.harness.mcp: cannot split {part.strip()!r}: {e}") from None
        return out

    @property
    def mcp_allowed(self) -> set[str] | None:
        """None = every MCP tool is allowed."""
        names = {n.strip() for n in self.mcp_allow.split(",") if n.strip()}
        return None if "*" in names else names

    @classmethod
    def from_config(cls, config: Any) -> "HarnessConfig":
        """From a full experiment config (its `harness` section) or the section itself; missing keys keep defaults."""
        if config is None:
            return cls()
        if "harness" in config:
            section = config["harness"]
        elif "enabled" in config or not hasattr(config, "keys"):
            section = config  # the section itself
        else:
            return cls()  # a full config without a harness section: the defaults
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "review_policy":
                review = section.get("review") if hasattr(section, "get") else None
                if review is not None and "policy" in review:
                    kw[f.name] = str(review["policy"])
                continue
            if f.name in section:
                value = section[f.name]
                try:
                    kw[f.name] = type(f.default)(value) if not isinstance(f.default, bool) else _bool(value, f.name)
                except (TypeError, ValueError):
                    raise HarnessConfigError(f"config.harness.{f.name}: cannot use {value!r}") from None
        unknown = sorted(set(section.keys()) - {f.name for f in dataclasses.fields(cls)} - {"review"})
        if unknown:
            raise HarnessConfigError(f"unknown config key: harness.{unknown[0]}")
        return cls(**kw)


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise HarnessConfigError(f"config.harness.{key} must be true or false, got {value!r}")
