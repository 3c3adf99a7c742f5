"""Skills: named, versioned procedures stored as JSON files, retrieved by relevance.

A skill file:

    {"name": "send_to_contact", "version": "1.0.0", "description": "...", "text": "what the planner reads",
     "triggers": ["text", "send", ...], "params": ["name", "body"],
     "macro": [{"name": "search_contacts", "arguments": {"query": "{name}"}},
               {"name": "send_sms", "arguments": {"to": "{$0.results.0.id}", "body": "{body}"}}]}

`text` goes into the system prompt when the skill is relevant to the request. A skill with a `macro` can
also be executed (the `run_skill` tool): `{param}` is replaced by the caller's parameter, `{$i.path.to}`
by a value from the result of macro step i. The macro runs through the same route as any tool call, and
stops at the first error (whose Feedback is returned with the step that failed).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Iterable

from mpa_jax.envs.contract import ErrorCode, Feedback, ToolSpec

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skills")
_NAME = re.compile(r"^[a-z][a-z0-9_]{1,63}$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
_PLACEHOLDER = re.compile(r"\{(\$?[A-Za-z0-9_.]+)\}")


class SkillError(ValueError):
    """A skill file is invalid; the message names the file and the field."""


@dataclasses.dataclass
class Skill:
    name: str
    version: str
    description: str
    text: str
    triggers: list[str] = dataclasses.field(default_factory=list)
    params: list[str] = dataclasses.field(default_factory=list)
    macro: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


def load_skill(path: str) -> Skill:
    """Read and check one skill file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SkillError(f"skill file {path}: {e}") from None
    if not isinstance(data, dict):
        raise SkillError(f"skill file {path}: expected a JSON object")
    for key in ("name", "version", "description", "text"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise SkillError(f"skill file {path}: field {key!r} must be a non-empty string")
    if not _NAME.match(data["name"]):
        raise SkillError(f"skill file {path}: name {data['name']!r} must be lower_snake_case")
    if not _SEMVER.match(data["version"]):
        raise SkillError(f"skill file {path}: version {data['version']!r} is not MAJOR.MINOR.PATCH")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(Skill)})
    if unknown:
        raise SkillError(f"skill file {path}: unknown field {unknown[0]!r}")
    for i, step in enumerate(data.get("macro", [])):
        if not isinstance(step, dict) or not isinstance(step.get("name"), str) or not isinstance(step.get("arguments", {}), dict):
            raise SkillError(f"skill file {path}: macro step {i} needs a tool 'name' and an 'arguments' object")
    return Skill(**data, source=path)


class SkillLibrary:
    """Every skill of some directories (later directories override a name, e.g. a newer harness version)."""

    def __init__(self, dirs: Iterable[str] = (SHIPPED_DIR,)) -> None:
        self.skills: dict[str, Skill] = {}
        for d in dirs:
            if not d:
                continue
            if not os.path.isdir(d):
                raise SkillError(f"skills directory {d} does not exist")
            for fn in sorted(os.listdir(d)):
                if fn.endswith(".json"):
                    s = load_skill(os.path.join(d, fn))
                    self.skills[s.name] = s

    def __len__(self) -> int:
        return len(self.skills)

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def retrieve(self, query: str, k: int = 2, tools: Iterable[str] = ()) -> list[Skill]:
        """The k skills most relevant to a request: trigger words in the query, plus macro tools among
        the tools offered. Skills with no overlap are never returned."""
        from mpa_jax.harness.retrieval import tokenize

        words = set(tokenize(query, expand=True))
        offered = set(tools)
        scored = []
        for s in self.skills.values():
            trig = {t.lower() for t in s.triggers}
            score = len(words & trig) + 0.5 * len({st["name"] for st in s.macro} & offered)
            if score > 0:
                scored.append((score, s.name, s))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [s for _, _, s in scored[:k]]

    def with_macros(self) -> list[Skill]:
        return [s for s in self.skills.values() if s.macro]


def skills_prompt(skills: list[Skill]) -> str:
    """The system-prompt section for retrieved skills."""
    if not skills:
        return ""
    lines = ["Skills that apply here:"]
    for s in skills:
        lines.append(f"- {s.name} (v{s.version}): {s.text}")
        if s.macro:
            example = json.dumps({"skill": s.name, "params": {p: "..." for p in s.params}})
            lines.append(f"  (run it with run_skill: {example})")
    return "\n".join(lines)


RUN_SKILL_SPEC = ToolSpec(
    name="run_skill", app="harness", domain="utilities", kind="write",
    description="Run a skill's macro (a fixed sequence of tool calls) with parameters; returns each step's result.",
    parameters={"type": "object", "properties": {
        "skill": {"type": "string", "minLength": 1, "maxLength": 64, "description": "skill name"},
        "params": {"type": "object", "description": "the skill's parameters"}},
        "required": ["skill"], "additionalProperties": False},
)


def _lookup(results: list[Any], ref: str) -> Any:
    parts = ref[1:].split(".")
    value: Any = results[int(parts[0])]
    for p in parts[1:]:
        value = value[int(p)] if isinstance(value, list) else value[p]
    return value


def expand(template: Any, params: dict[str, Any], results: list[Any]) -> Any:
    """Fill `{param}` and `{$i.path}` placeholders (a whole-string placeholder keeps the value's type)."""
    if isinstance(template, dict):
        return {k: expand(v, params, results) for k, v in template.items()}
    if isinstance(template, list):
        return [expand(v, params, results) for v in template]
    if not isinstance(template, str):
        return template

    def value(key: str) -> Any:
        if key.startswith("$"):
            return _lookup(results, key)
        if key not in params:
            raise KeyError(key)
        return params[key]

    whole = _PLACEHOLDER.fullmatch(template)
    if whole:
        return value(whole.group(1))
    return _PLACEHOLDER.sub(lambda m: str(value(m.group(1))), template)


def run_macro(skill: Skill, params: dict[str, Any], call: Callable[[str, dict[str, Any], str], Feedback],
              call_id: str = "") -> Feedback:
    """Execute a skill macro through `call(name, args, call_id)`; one Feedback for the whole macro."""
    if not skill.macro:
        return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"skill {skill.name} has no macro to run", call_id,
                              "read the skill's text and make the calls yourself")
    missing = [p for p in skill.params if p not in params]
    if missing:
        return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"skill {skill.name} needs params {missing}", call_id,
                              f"params: {', '.join(skill.params)}")
    results: list[Any] = []
    steps = []
    for i, step in enumerate(skill.macro):
        try:
            args = expand(step.get("arguments", {}), params, results)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            return Feedback.error(ErrorCode.PRECONDITION_FAILED,
                                  f"skill {skill.name} step {i} ({step['name']}): cannot fill {e}", call_id,
                                  "an earlier step returned no such value; make the calls yourself",
                                  ) if not steps else _partial(skill, steps, call_id, f"step {i}: cannot fill {e}")
        fb = call(step["name"], args, f"{call_id}.{i}")
        steps.append({"tool": step["name"], "arguments": args, "status": fb.status, "result": fb.result,
                      **({"error": getattr(fb.error_code, "value", fb.error_code), "message": fb.message} if not fb.ok else {})})
        if not fb.ok:
            out = Feedback.error(ErrorCode(fb.error_code), f"skill {skill.name} stopped at step {i} ({step['name']}): {fb.message}",
                                 call_id, fb.hint)
            out.result = {"steps": steps}
            return out
        results.append(fb.result)
    return Feedback(call_id=call_id, status="ok", result={"skill": skill.name, "version": skill.version, "steps": steps})


def _partial(skill: Skill, steps: list[dict[str, Any]], call_id: str, why: str) -> Feedback:
    fb = Feedback.error(ErrorCode.PRECONDITION_FAILED, f"skill {skill.name}: {why}", call_id,
                        "continue by hand from the last successful step")
    fb.result = {"steps": steps}
    return fb
