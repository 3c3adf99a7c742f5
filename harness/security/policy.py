"""Sink policies as data: per tool, which arguments are sinks and which words of the user's request make the tool
intended (CaMeL's "control flow from the user"), loaded from reviewed, versioned JSON files (no jax).

A policy file (`harness/security/policies/<name>.json`):

    {"name": "sandbox", "on_violation": "refuse",
     "tools": {"send_sms": {"purpose": ["text", "message", "reply"], "args": {"to": "value", "body": "content"}}}}

- `purpose`: words (matched as word prefixes, case-insensitive) of which one must occur in what the user said
  (or in an error the env itself gave, e.g. "cellular is off") for the tool to be called at all; empty = any.
- `args`: `value` = the whole argument (every scalar in it) must come from a trusted source; `content` = every
  address-like entity in the text (emails, URLs, phone numbers, IBANs) must (free text itself is allowed).
- `on_violation`: `refuse` (a PERMISSION_DENIED Feedback the planner sees) or `confirm` (the same refusal, worded as
  "ask the user to confirm": no user answers inside an episode, so the call does not run either way).

Releases: `policies/manifest.json` holds the policy set's semver, its review record (who, when, note) and the sha256
of every policy file; `load_policy` refuses a file whose digest is not the reviewed one, so a policy edit is a new
reviewed release (bump the version, record the review, update the digests: `python -m mpa_jax.harness.security.policy
--release X.Y.Z --by NAME --note TEXT`), logged in `policies/CHANGELOG.md` like the harness's own versions.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import os
import re
from typing import Any

POLICY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "policies")
SINK_KINDS = ("value", "content")
VIOLATION_MODES = ("refuse", "confirm")
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")


class PolicyError(ValueError):
    """A policy file is malformed or not the reviewed release; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class SinkRule:
    """One sensitive tool: its sink arguments (name -> `value` | `content`) and its purpose words."""

    tool: str
    args: dict[str, str]
    purpose: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Policy:
    """A reviewed sink policy for one tool set (the sandbox's, or one AgentDojo suite's)."""

    name: str
    version: str
    on_violation: str
    rules: dict[str, SinkRule]

    def rule(self, tool: str) -> SinkRule | None:
        return self.rules.get(tool)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def parse_policy(data: Any, where: str, version: str = "0.0.0") -> Policy:
    """A policy from its JSON data (`where` names the file in errors)."""
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: a policy is a JSON object")
    unknown = sorted(set(data) - {"name", "on_violation", "tools", "note"})
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r} (keys: name, on_violation, tools, note)")
    name, mode, tools = data.get("name"), data.get("on_violation"), data.get("tools")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{where}: name must be a non-empty string")
    if mode not in VIOLATION_MODES:
        raise PolicyError(f"{where}: on_violation must be one of {', '.join(VIOLATION_MODES)}, got {mode!r}")
    if not isinstance(tools, dict) or not tools:
        raise PolicyError(f"{where}: tools must be a non-empty object of tool name -> rule")
    rules = {}
    for tool, r in tools.items():
        if not isinstance(r, dict) or set(r) - {"args", "purpose"}:
            raise PolicyError(f"{where}: tools.{tool} must be an object with keys args and purpose")
        args, purpose = r.get("args", {}), r.get("purpose", [])
        if not isinstance(args, dict) or any(k not in SINK_KINDS for k in args.values()):
            raise PolicyError(f"{where}: tools.{tool}.args maps argument names to one of {', '.join(SINK_KINDS)}")
        if not isinstance(purpose, list) or not all(isinstance(w, str) and w for w in purpose):
            raise PolicyError(f"{where}: tools.{tool}.purpose must be a list of words")
        rules[tool] = SinkRule(tool, dict(args), tuple(w.lower() for w in purpose))
    return Policy(name, version, mode, rules)


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_manifest(policy_dir: str = POLICY_DIR) -> dict[str, Any]:
    """The release manifest of a policy directory (version, review record, file digests)."""
    path = os.path.join(policy_dir, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            man = json.load(f)
    except FileNotFoundError:
        raise PolicyError(f"{path}: no policy manifest (release the policies first)") from None
    if not SEMVER.match(str(man.get("version", ""))) or not isinstance(man.get("files"), dict) or not man.get("review"):
        raise PolicyError(f"{path}: a manifest needs version (X.Y.Z), review and files")
    return man


@functools.lru_cache(maxsize=None)
def load_policy(name: str, policy_dir: str = POLICY_DIR) -> Policy:
    """The reviewed policy `name` (file `<name>.json`); PolicyError when it is unknown or its digest is not the
    released one (an unreviewed edit)."""
    man = read_manifest(policy_dir)
    fname = f"{name}.json"
    path = os.path.join(policy_dir, fname)
    if fname not in man["files"]:
        raise PolicyError(f"no released policy {name!r} in {policy_dir} (released: "
                          f"{', '.join(sorted(f[:-5] for f in man['files']))})")
    if _sha(path) != man["files"][fname]:
        raise PolicyError(f"{path}: its sha256 is not the one released as {man['version']} (an unreviewed edit: "
                          "release it with `python -m mpa_jax.harness.security.policy --release`)")
    with open(path, encoding="utf-8") as f:
        return parse_policy(json.load(f), path, man["version"])


POLICY_KINDS = {"sandbox": "sandbox", "adb": "sandbox"}  # the device runs the sandbox's tools


def policy_for(kind: str, task_metadata: dict[str, Any] | None = None) -> str:
    """The policy name for an env kind (an AgentDojo task's suite picks its suite's policy); "" for a kind with no
    policy yet (bfcl, simulated: their results are still marked as data)."""
    if kind == "agentdojo":
        suite = (task_metadata or {}).get("suite")
        if not suite:
            raise PolicyError("an agentdojo task without metadata.suite has no policy")
        return f"agentdojo_{suite}"
    return POLICY_KINDS.get(kind, "")


def release(version: str, by: str, note: str, policy_dir: str = POLICY_DIR) -> dict[str, Any]:
    """Record a reviewed release of every policy file: new manifest (digests, review) and a CHANGELOG entry."""
    if not SEMVER.match(version):
        raise PolicyError(f"release version must be X.Y.Z, got {version!r}")
    files = sorted(f for f in os.listdir(policy_dir) if f.endswith(".json") and f != "manifest.json")
    for f in files:  # every file must parse before it is released
        with open(os.path.join(policy_dir, f), encoding="utf-8") as fh:
            parse_policy(json.load(fh), f, version)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    man = {"version": version, "review": {"by": by, "at": when, "note": note},
           "files": {f: _sha(os.path.join(policy_dir, f)) for f in files}}
    with open(os.path.join(policy_dir, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(man, fh, indent=1, sort_keys=True)
        fh.write("\n")
    with open(os.path.join(policy_dir, "CHANGELOG.md"), "a", encoding="utf-8") as fh:
        fh.write(f"\n## {version} ({when}, reviewed by {by})\n\n{note}\n")
    load_policy.cache_clear()
    return man


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Release the reviewed sink policies (new manifest + CHANGELOG entry).")
    p.add_argument("--release", required=True, help="the new version, X.Y.Z")
    p.add_argument("--by", required=True, help="who reviewed it")
    p.add_argument("--note", required=True, help="what changed and why")
    a = p.parse_args()
    print(json.dumps(release(a.release, a.by, a.note), indent=1))
