"""Evolution with review: failure traces -> clustered proposals with evidence -> reviewed -> versions.

    mine(trajectories) -> proposals            # clusters by (tool, error code, template)
    store.add_proposal(...)                    # pending, with evidence (task ids, steps, messages)
    review: approve / reject by id             # recorded: who, when, note
    release(store, root) -> new version dir    # only approved, unreleased proposals; semver + CHANGELOG + manifest

Proposal kinds:
- `normaliser`: an argument rewrite {tool, arg, from, to}: a call failed with a value and the same tool
  then succeeded with the argument changed, consistently across the cluster's evidence;
- `skill`: a successful recovery (error, then a different tool or a fix, then a verified success)
  distilled into a skill file (text + the recovery's tool sequence as a macro without fixed values);
- `tool_description`: the tool's description with a note on the values it refuses;
- `training_examples`: the successful recovery episodes of the cluster, for the model's training data;
- `grounding`: ground the names in tool arguments (harness/grounding.py): failed episodes called tools
  with a name the conversation never showed, one request name away from the right one, and successful
  episodes (almost) never did.

A version directory `<root>/versions/<X.Y.Z>/` holds `manifest.json` (version, parent, created, the
proposals with their approval records, `auto_approved`, sha256 of every file), `rewrites.json`,
`descriptions.json`, `grounding.json`, `skills/*.json`, `training_examples.jsonl`. It is written to a temporary
directory and renamed into place (atomic); `<root>/CHANGELOG.md` gets one entry per version and
`<root>/CURRENT` names the newest. Nothing changes without a recorded approval.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import defaultdict
from typing import Any, Iterable

from mpa_jax.envs.contract import ErrorCode, Trajectory, canonical_json
from mpa_jax.files import write_text
from mpa_jax.harness.config import HARNESS_VERSION
from mpa_jax.harness.store import HarnessStore, HarnessStoreError

MINABLE = {ErrorCode.INVALID_ARGUMENTS, ErrorCode.UNSUPPORTED_VALUE, ErrorCode.UNKNOWN_TOOL, ErrorCode.NOT_FOUND,
           ErrorCode.PRECONDITION_FAILED, ErrorCode.AMBIGUOUS, ErrorCode.PERMISSION_DENIED}


class EvolutionError(ValueError):
    """Bad traces or an impossible review step; the message names it."""


@dataclasses.dataclass
class HarnessVersion:
    """What an approved harness version changes (`read_version` loads one from its directory)."""

    version: str = HARNESS_VERSION
    rewrites: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    descriptions: dict[str, str] = dataclasses.field(default_factory=dict)
    grounding: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {tool, arg}: harness/grounding.py
    skills_dir: str = ""
    auto_approved: bool = False


def _pid(kind: str, cluster: str, payload: dict[str, Any]) -> str:
    h = hashlib.sha256(canonical_json({"kind": kind, "cluster": cluster, "payload": payload}).encode()).hexdigest()
    return f"{kind[:4]}-{h[:10]}"


def read_traces(paths: Iterable[str]) -> list[Trajectory]:
    """Trajectory JSONL files; a bad line names the file and line."""
    from mpa_jax.envs.contract import ContractError, read_jsonl

    out: list[Trajectory] = []
    for p in paths:
        if not os.path.isfile(p):
            raise EvolutionError(f"trace file {p} does not exist")
        try:
            out += read_jsonl(p, Trajectory)
        except ContractError as e:
            raise EvolutionError(str(e)) from None
    return out


def _tool_calls(traj: Trajectory) -> list[tuple[int, Any, Any]]:
    return [(i, s.action, s.feedback) for i, s in enumerate(traj.steps) if s.action.kind == "tool_call" and s.feedback is not None]


def mine(trajectories: Iterable[Trajectory], min_count: int = 2) -> list[dict[str, Any]]:
    """Cluster failures by (tool, error code, template) and turn clusters into proposals with evidence;
    add the `grounding` proposals of `mine_grounding`."""
    trajectories = list(trajectories)
    clusters: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    episodes: dict[str, Trajectory] = {}
    for traj in trajectories:
        episodes.setdefault(traj.task_id, traj)
        if traj.infra_failure:
            continue
        template = str(traj.provenance.get("template", ""))
        success = bool(traj.verification and traj.verification.success)
        calls = _tool_calls(traj)
        for k, (i, a, fb) in enumerate(calls):
            if fb.ok or fb.error_code is None:
                continue
            code = ErrorCode(fb.error_code)
            if code not in MINABLE:
                continue
            later = calls[k + 1:]
            recovery = []
            for j, a2, fb2 in later:
                recovery.append({"step": j, "tool": a2.name, "arguments": a2.arguments, "ok": fb2.ok})
                if fb2.ok and a2.name == a.name:
                    break
                if fb2.ok and a2.name != a.name and len(recovery) >= 1 and code in (ErrorCode.UNSUPPORTED_VALUE, ErrorCode.INVALID_ARGUMENTS):
                    break
            clusters[(a.name, code.value, template)].append({
                "task_id": traj.task_id, "step": i, "arguments": a.arguments, "message": fb.message, "success": success,
                "recovery": recovery})
    proposals: list[dict[str, Any]] = []
    for (tool, code, template), ev in sorted(clusters.items()):
        if len(ev) < min_count:
            continue
        cluster = f"{tool}|{code}|{template}"
        proposals += _proposals_for(tool, code, template, cluster, ev, episodes)
    return proposals + mine_grounding(trajectories, min_count=min_count)


def _ungrounded(traj: Trajectory) -> list[tuple[int, str, str, list[tuple[str, str]]]]:
    """(step, tool, arg, replacements) for each string argument of a tool call that grounding would change,
    judged on what the episode had shown before that call (its prompt messages and earlier tool results)."""
    from mpa_jax.harness.grounding import ground_value

    msgs = traj.messages
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "tool"), len(msgs))
    # the prompt ends with the last user message before the first tool result (the request)
    prompt_end = max((i for i in range(first) if msgs[i].get("role") == "user"), default=0) + 1
    seen = [str(m.get("content") or "") for m in msgs[:prompt_end]]
    request = "\n".join(str(m.get("content") or "") for m in msgs[1:prompt_end])
    out = []
    for i, step in enumerate(traj.steps):
        a, fb = step.action, step.feedback
        if a.kind == "tool_call" and isinstance(a.arguments, dict):
            shown = "\n".join(seen)
            for key, value in a.arguments.items():
                if isinstance(value, str):
                    _, rep = ground_value(value, shown, request)
                    if rep:
                        out.append((i, a.name, key, rep))
        if fb is not None and fb.result is not None:
            seen.append(json.dumps(fb.result, ensure_ascii=False))
    return out


def mine_grounding(trajectories: Iterable[Trajectory], min_count: int = 2) -> list[dict[str, Any]]:
    """One `grounding` proposal {tool: "*", arg: "*"} when ungrounded names (harness/grounding.py) show up
    in at least `min_count` failed episodes and in at most a quarter as many successful ones (grounding
    must not touch what works). Episodes, not tasks, as the error clusters count: an RL group that
    invents four different surnames for one request is four pieces of evidence. One rule for any
    argument of any tool: a planner that invents names does so wherever it copies one, and each
    (tool, argument) alone is rarely seen twice in a round's traces."""
    fails: list[dict[str, Any]] = []
    failed_episodes = won_episodes = 0
    for traj in trajectories:
        if traj.infra_failure or traj.verification is None:
            continue
        found = _ungrounded(traj)
        if found and traj.verification.success:
            won_episodes += 1
        elif found:
            failed_episodes += 1
            fails += [{"task_id": traj.task_id, "step": step, "tool": tool, "arg": key, "success": False,
                       "message": "; ".join(f"{a!r} not in the conversation, the request has {b!r}" for a, b in rep)}
                      for step, tool, key, rep in found]
    if failed_episodes < min_count or won_episodes * 4 > failed_episodes:
        return []
    cluster, payload = "*|UNGROUNDED_NAME|*", {"tool": "*", "arg": "*"}
    return [{"id": _pid("grounding", cluster, payload), "kind": "grounding", "cluster": cluster, "payload": payload,
             "evidence": fails}]


def _proposals_for(tool: str, code: str, template: str, cluster: str, ev: list[dict[str, Any]],
                   episodes: dict[str, Trajectory]) -> list[dict[str, Any]]:
    out = []
    evidence = [{k: e[k] for k in ("task_id", "step", "message", "success")} for e in ev]
    # Normaliser: the same tool succeeded right after with one argument changed, the same way every time.
    rewrites: dict[tuple[str, str], set[str]] = defaultdict(set)
    for e in ev:
        rec = e["recovery"]
        if rec and rec[-1]["ok"] and rec[-1]["tool"] == tool and isinstance(e["arguments"], dict) and isinstance(rec[-1]["arguments"], dict):
            for key, before in e["arguments"].items():
                after = rec[-1]["arguments"].get(key)
                if isinstance(before, str) and isinstance(after, str) and before != after:
                    rewrites[(key, before)].add(after)
    for (key, before), afters in sorted(rewrites.items()):
        if len(afters) == 1:
            payload = {"tool": tool, "arg": key, "from": before, "to": next(iter(afters))}
            out.append({"id": _pid("normaliser", cluster, payload), "kind": "normaliser", "cluster": cluster,
                        "payload": payload, "evidence": evidence})
    # Skill: a recovery through other tools that ended in a verified success.
    recoveries = [e for e in ev if e["success"] and e["recovery"] and any(r["tool"] != tool for r in e["recovery"])]
    if recoveries:
        seq = [r["tool"] for r in recoveries[0]["recovery"] if r["ok"]]
        name = re.sub(r"[^a-z0-9_]", "_", f"recover_{tool}_{code.lower()}")[:60]
        text = (f"When {tool} fails with {code} (for example: {recoveries[0]['message'][:160]}), do not repeat the same call: "
                f"recover with {' then '.join(dict.fromkeys(seq)) or 'another tool'}, as in {len(recoveries)} successful episodes.")
        skill = {"name": name, "version": "1.0.0", "description": f"Recover from {code} of {tool}.", "text": text,
                 "triggers": sorted({tool, *tool.split("_"), code.lower()}), "params": [], "macro": []}
        out.append({"id": _pid("skill", cluster, skill), "kind": "skill", "cluster": cluster, "payload": skill, "evidence": evidence})
        ids = sorted({e["task_id"] for e in recoveries})
        examples = {"tool": tool, "code": code, "task_ids": ids,
                    "episodes": [episodes[i].to_dict() for i in ids if i in episodes]}
        out.append({"id": _pid("training_examples", cluster, examples), "kind": "training_examples", "cluster": cluster,
                    "payload": examples, "evidence": evidence})
    # Tool description: say which values the tool refuses.
    if code in ("INVALID_ARGUMENTS", "UNSUPPORTED_VALUE"):
        from mpa_jax.envs.tools import TOOLS

        base = TOOLS[tool].spec.description if tool in TOOLS else ""
        msgs = sorted({e["message"][:120] for e in ev})[:2]
        payload = {"tool": tool, "description": (base + " Known refusals: " + " | ".join(msgs)).strip()}
        out.append({"id": _pid("tool_description", cluster, payload), "kind": "tool_description", "cluster": cluster,
                    "payload": payload, "evidence": evidence})
    return out


def submit(store: HarnessStore, proposals: list[dict[str, Any]], policy: str = "manual") -> list[str]:
    """Queue proposals (new ids only); with policy "auto" they are approved at once, recorded as such."""
    added = []
    for p in proposals:
        if store.add_proposal(p["id"], p["kind"], p["cluster"], p["payload"], p["evidence"]):
            added.append(p["id"])
            if policy == "auto":
                store.decide(p["id"], "approved", "auto-policy", "review.policy=auto")
    return added


def _bump(version: str, kinds: set[str]) -> str:
    major, minor, patch = (int(x) for x in version.split("."))
    if kinds & {"skill", "tool_description"}:
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{patch + 1}"


def current_version(root: str) -> str:
    path = os.path.join(root, "CURRENT")
    if not os.path.isfile(path):
        return HARNESS_VERSION
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def release(store: HarnessStore, root: str, trajectories: Iterable[Trajectory] = ()) -> str | None:
    """Write a new harness version from the approved, unreleased proposals; None when there are none.

    The new version starts from the current one (its rewrites, descriptions and skills carry over).
    `trajectories` supply the episodes that `training_examples` proposals name.
    """
    approved = [p for p in store.proposals("approved") if not p["version"]]
    if not approved:
        return None
    parent = current_version(root)
    version = _bump(parent, {p["kind"] for p in approved})
    versions = os.path.join(root, "versions")
    os.makedirs(versions, exist_ok=True)
    final = os.path.join(versions, version)
    if os.path.exists(final):
        raise EvolutionError(f"harness version {version} already exists at {final}")
    tmp = tempfile.mkdtemp(dir=versions, prefix=f".{version}-")
    try:
        prev = os.path.join(versions, parent)
        rewrites, descriptions, grounding = [], {}, []
        if os.path.isdir(prev):
            old = read_version(prev)
            rewrites, descriptions, grounding = list(old.rewrites), dict(old.descriptions), list(old.grounding)
            if os.path.isdir(os.path.join(prev, "skills")):
                shutil.copytree(os.path.join(prev, "skills"), os.path.join(tmp, "skills"))
        os.makedirs(os.path.join(tmp, "skills"), exist_ok=True)
        by_id = {t.task_id: t for t in trajectories}
        examples = []
        for p in approved:
            pay = p["payload"]
            if p["kind"] == "normaliser":
                rewrites.append(pay)
            elif p["kind"] == "tool_description":
                descriptions[pay["tool"]] = pay["description"]
            elif p["kind"] == "grounding":
                if pay not in grounding:
                    grounding.append(pay)
            elif p["kind"] == "skill":
                with open(os.path.join(tmp, "skills", pay["name"] + ".json"), "w", encoding="utf-8") as f:
                    json.dump(pay, f, indent=2, sort_keys=True)
            elif p["kind"] == "training_examples":
                # The episodes travel with the proposal; `trajectories` can supply ones it lacks.
                have = {e["task_id"] for e in pay.get("episodes", [])}
                examples += [canonical_json(e) for e in pay.get("episodes", [])]
                examples += [by_id[t].to_json() for t in pay["task_ids"] if t in by_id and t not in have]
        with open(os.path.join(tmp, "rewrites.json"), "w", encoding="utf-8") as f:
            json.dump(rewrites, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "descriptions.json"), "w", encoding="utf-8") as f:
            json.dump(descriptions, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "grounding.json"), "w", encoding="utf-8") as f:
            json.dump(grounding, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "training_examples.jsonl"), "w", encoding="utf-8") as f:
            f.write("".join(e + "\n" for e in examples))
        files = {}
        for dirpath, _, names in os.walk(tmp):
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                files[os.path.relpath(full, tmp)] = _sha(full)
        auto = any(p["decided_by"] == "auto-policy" for p in approved)
        manifest = {
            "version": version, "parent": parent, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "auto_approved": auto,
            "proposals": [{"id": p["id"], "kind": p["kind"], "cluster": p["cluster"], "approved_by": p["decided_by"],
                           "approved_at": p["decided_at"], "note": p["note"], "evidence": len(p["evidence"])} for p in approved],
            "files": dict(sorted(files.items())),
        }
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    store.mark_released([p["id"] for p in approved], version)
    entry = [f"## {version} ({manifest['created']}){' — auto-approved' if auto else ''}", f"parent {parent}"]
    entry += [f"- {p['kind']} {p['id']} ({p['cluster']}), approved by {p['decided_by']}" for p in approved]
    log = os.path.join(root, "CHANGELOG.md")
    old_log = open(log, encoding="utf-8").read() if os.path.isfile(log) else "# Harness changelog\n"
    write_text(log, old_log.rstrip("\n") + "\n\n" + "\n".join(entry) + "\n")
    write_text(os.path.join(root, "CURRENT"), version + "\n")
    return version


def withdraw(root: str, version: str, reason: str) -> str:
    """Take back a released version that a release gate rejected: CURRENT returns to its parent, the
    version directory is kept for the record as `versions/<version>.withdrawn` (its number is free again),
    and the changelog says why. Its proposals stay marked released, so they are not proposed again.
    Returns the parent version."""
    final = os.path.join(root, "versions", version)
    with open(os.path.join(final, "manifest.json"), encoding="utf-8") as f:
        parent = str(json.load(f)["parent"])
    if current_version(root) != version:
        raise EvolutionError(f"harness version {version} is not the current one ({current_version(root)}): not withdrawn")
    kept = final + ".withdrawn"
    if os.path.exists(kept):
        shutil.rmtree(kept)
    os.rename(final, kept)
    log = os.path.join(root, "CHANGELOG.md")
    old_log = open(log, encoding="utf-8").read() if os.path.isfile(log) else "# Harness changelog\n"
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    write_text(log, old_log.rstrip("\n") + f"\n\n## {version} withdrawn ({stamp})\n{reason}; current is {parent} again\n")
    write_text(os.path.join(root, "CURRENT"), parent + "\n")
    return parent


def read_version(path: str) -> HarnessVersion:
    """Load a version directory (checking every file against the manifest's hashes)."""
    mpath = os.path.join(path, "manifest.json")
    if not os.path.isfile(mpath):
        raise EvolutionError(f"harness version {path}: no manifest.json")
    with open(mpath, encoding="utf-8") as f:
        manifest = json.load(f)
    for rel, digest in manifest.get("files", {}).items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full) or _sha(full) != digest:
            raise EvolutionError(f"harness version {path}: {rel} does not match its manifest hash")
    with open(os.path.join(path, "rewrites.json"), encoding="utf-8") as f:
        rewrites = json.load(f)
    with open(os.path.join(path, "descriptions.json"), encoding="utf-8") as f:
        descriptions = json.load(f)
    grounding = []  # versions released before grounding existed have no grounding.json
    if os.path.isfile(os.path.join(path, "grounding.json")):
        with open(os.path.join(path, "grounding.json"), encoding="utf-8") as f:
            grounding = json.load(f)
    skills = os.path.join(path, "skills")
    return HarnessVersion(version=str(manifest["version"]), rewrites=rewrites, descriptions=descriptions, grounding=grounding,
                          skills_dir=skills if os.path.isdir(skills) else "", auto_approved=bool(manifest.get("auto_approved")))


def store_path(root: str) -> str:
    """The proposal store (SQLite) of a harness root."""
    return os.path.join(root, "store.sqlite")


@dataclasses.dataclass(frozen=True)
class Evolved:
    """What one `evolve` did: the proposals mined, the ids newly queued, the version released (or None)."""

    proposals: list[dict[str, Any]]
    added: list[str]
    version: str | None


def evolve(root: str, trajectories: list[Trajectory], policy: str, min_count: int = 2) -> Evolved:
    """The harness release, one service for `mpa loop` and `mpa harness mine`: mine `trajectories` into
    proposals, queue the new ones (approved at once under `policy` "auto"), and release a version from the
    approved, unreleased proposals. The store under `root` is opened and closed here."""
    proposals = mine(trajectories, min_count=min_count)
    with HarnessStore(store_path(root)) as store:
        added = submit(store, proposals, policy=policy)
        version = release(store, root, trajectories)
    return Evolved(proposals, added, version)


__all__ = ["EvolutionError", "Evolved", "HarnessStoreError", "evolve", "mine", "mine_grounding", "submit", "release", "withdraw", "read_version", "read_traces", "current_version"]
