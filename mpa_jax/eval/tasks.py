"""Which tasks an evaluation runs: one stratified selection, optionally split into templates seen in training
and held-out templates, and the pre-registered test set (no jax).

    select_tasks("dev", n_seen=32, n_held_out=16)   # 48 dev tasks (tuning)
    select_tasks("test", n=32)                       # 32 test tasks spread over domain x category
    evaluation_tasks("preregistered", n_seen=32, n_held_out=16)   # the demo's and the loop's 48 test tasks

The pre-registered test set (`preregistered_test.json` beside this module, docs/preregistered.md) is read
only through `evaluation_tasks` / `preregistered_tasks`, and only evaluation code calls them (a test greps
the tree): no selection, tuning or training code can reach it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pathlib
from typing import Any, Sequence

PREREGISTERED = "preregistered"  # the split name evaluation code accepts for the pre-registered test set
PREREGISTERED_FILE = pathlib.Path(__file__).with_name("preregistered_test.json")
# The task fields a listed task's hash covers: its content, not the record's bookkeeping (schema_version, the
# generator's version number), so a new optional Task field or a version bump alone is no drift.
HASHED_FIELDS = ("id", "domain", "category", "difficulty", "instruction", "tools", "verifier", "gold", "history", "roles",
                 "initial_state", "faults", "template", "split", "seed", "persona_seed", "metadata")


# The categories the list was drawn from when it was registered: categories added since (conversations,
# "followup") are outside it, so the recorded recipe still rebuilds the same 600 tasks.
PREREGISTERED_CATEGORIES = ("tool_use", "memory", "skills", "subagent")
# Template families added since (the prompt-injection scenarios, issue 52) are outside it for the same reason.
PREREGISTERED_EXCLUDED = ("inject.",)


class PreregisteredError(ValueError):
    """The pre-registered test set cannot be rebuilt as registered, or was asked for where it must not be."""


@functools.lru_cache(maxsize=1)
def held_out_templates() -> frozenset[str]:
    """Names of the templates the train split never uses."""
    from mpa_jax.envs.taskgen import TEMPLATES

    return frozenset(t.name for t in TEMPLATES if t.held_out)


def template_group(template: str) -> str:
    """"held_out" for a held-out template, else "seen" (the grouping key of `eval.metrics`)."""
    return "held_out" if template in held_out_templates() else "seen"


def stratified(tasks: Sequence[Any], n: int) -> list[Any]:
    """`n` tasks spread over (domain, category) cells, deterministically (n <= 0: all, in their order).

    Cells are visited on a diagonal walk (the k-th visit takes domain k mod D and category
    (k mod D + k div D) mod C), so any D consecutive picks cover every domain and the categories
    rotate; then round-robin in depth. A split's head alone would be one domain.
    """
    tasks = list(tasks)
    if n <= 0:
        return tasks
    n = min(n, len(tasks))
    cells: dict[tuple[str, str], list[Any]] = {}
    for t in tasks:
        cells.setdefault((t.domain, t.category), []).append(t)
    domains = sorted({d for d, _ in cells})
    categories = sorted({c for _, c in cells})
    nd, nc = len(domains), len(categories)
    walk = [(domains[k % nd], categories[(k % nd + k // nd) % nc]) for k in range(nd * nc)]
    order = [cell for cell in walk if cell in cells]
    out: list[Any] = []
    depth = 0
    while len(out) < n:
        for key in order:
            if depth < len(cells[key]) and len(out) < n:
                out.append(cells[key][depth])
        depth += 1
    return out


def select_tasks(split: str, *, n: int = 0, n_seen: int = 0, n_held_out: int = 0, seed: int = 0,
                 per_template: int = 0, categories: Sequence[str] | None = None,
                 exclude_templates: Sequence[str] = ()) -> list[Any]:
    """Tasks of `split` (a split name or a task JSONL): `n_seen` of templates seen in training followed by
    `n_held_out` of held-out templates when either is set, else `n` of all (0 = every task); each part
    stratified over (domain, category). `categories`: only tasks of these (None = all); `exclude_templates`:
    template-name prefixes left out."""
    from mpa_jax.envs import load_tasks

    if split == PREREGISTERED:
        raise PreregisteredError(f"select_tasks({split!r}): the pre-registered test set is not a split to select from; "
                                 "evaluation code reads it through evaluation_tasks()")
    tasks = load_tasks(split, seed=seed, per_template=per_template)
    if categories is not None:
        tasks = [t for t in tasks if t.category in categories]
    if exclude_templates:
        tasks = [t for t in tasks if not t.template.startswith(tuple(exclude_templates))]
    if n_seen or n_held_out:
        ho = held_out_templates()
        seen = [t for t in tasks if t.template not in ho]
        held = [t for t in tasks if t.template in ho]
        return (stratified(seen, n_seen) if n_seen else []) + (stratified(held, n_held_out) if n_held_out else [])
    return stratified(tasks, n)


# ---------------------------------------------------------------------------- the pre-registered test set
def task_digest(task: Any, fields: Sequence[str] = HASHED_FIELDS) -> str:
    """sha256 of the canonical JSON of `task`'s `fields` (metadata without its `generator_version`)."""
    from mpa_jax.envs.contract import canonical_json

    d = task.to_dict()
    content = {f: d[f] for f in fields}
    if "metadata" in content:
        content["metadata"] = {k: v for k, v in content["metadata"].items() if k != "generator_version"}
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def build_preregistered(*, split: str = "test", seed: int = 0, per_template: int = 0, n_seen: int = 300,
                        n_held_out: int = 300, demo_seen: int = 32, demo_held_out: int = 16,
                        registered: str = "", commit: str = "") -> dict[str, Any]:
    """The pre-registered list as written to `PREREGISTERED_FILE`: `n_seen` tasks of templates seen in training
    then `n_held_out` of held-out templates of `split` (each part stratified over domain x category by
    `select_tasks`), each with its template group and `task_digest`; the demo subset is the first `demo_seen`
    of the seen part and the first `demo_held_out` of the held-out part (a stratified order: spread too)."""
    if split == PREREGISTERED:
        raise PreregisteredError("build_preregistered: split must be a benchmark split")
    tasks = select_tasks(split, n_seen=n_seen, n_held_out=n_held_out, seed=seed, per_template=per_template,
                         categories=PREREGISTERED_CATEGORIES,
                         exclude_templates=PREREGISTERED_EXCLUDED)
    entries = [{"id": t.id, "template": t.template, "group": template_group(t.template), "domain": t.domain,
                "category": t.category, "sha256": task_digest(t)} for t in tasks]
    seen = [e["id"] for e in entries if e["group"] == "seen"]
    held = [e["id"] for e in entries if e["group"] == "held_out"]
    if len(seen) != n_seen or len(held) != n_held_out:
        raise PreregisteredError(f"build_preregistered: {split} has {len(seen)} seen / {len(held)} held-out tasks, "
                                 f"wanted {n_seen} / {n_held_out}")
    return {"name": "preregistered test set", "registered": registered, "commit": commit,
            "rebuild": {"split": split, "seed": seed, "per_template": per_template, "n_seen": n_seen,
                        "n_held_out": n_held_out, "demo_seen": demo_seen, "demo_held_out": demo_held_out},
            "hashed_fields": list(HASHED_FIELDS), "tasks": entries,
            "subsets": {"demo": seen[:demo_seen] + held[:demo_held_out]}}


def _read_list(path: pathlib.Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PreregisteredError(f"pre-registered test set {path}: cannot be read ({e})") from None
    for key in ("rebuild", "hashed_fields", "tasks", "subsets"):
        if key not in doc:
            raise PreregisteredError(f"pre-registered test set {path}: no {key!r}")
    return doc


def preregistered_tasks(subset: str = "all", path: str | pathlib.Path | None = None) -> list[Any]:
    """The pre-registered tasks in list order (`subset`: "all", "seen", "held_out" or a named subset of the file,
    "demo"), rebuilt from the recorded split, tasks seed and per-template count; every listed task must still
    exist with the same content hash and template group, else one PreregisteredError names what drifted."""
    from mpa_jax.envs import load_tasks

    path = pathlib.Path(path) if path is not None else PREREGISTERED_FILE
    doc = _read_list(path)
    rb = doc["rebuild"]
    by_id = {t.id: t for t in load_tasks(str(rb["split"]), seed=int(rb["seed"]), per_template=int(rb["per_template"]))}
    fields = tuple(doc["hashed_fields"])
    missing, changed, regrouped = [], [], []
    for e in doc["tasks"]:
        t = by_id.get(e["id"])
        if t is None:
            missing.append(e["id"])
        elif task_digest(t, fields) != e["sha256"]:
            changed.append(e["id"])
        elif template_group(t.template) != e["group"]:
            regrouped.append(e["id"])
    if missing or changed or regrouped:
        parts = [f"{len(v)} {what} (first: {v[0]})" for v, what in
                 ((missing, "no longer generated"), (changed, "changed content (sha256 mismatch)"),
                  (regrouped, "moved between seen and held-out templates")) if v]
        raise PreregisteredError(f"pre-registered test set {path} drifted from split {rb['split']!r} seed {rb['seed']} "
                                 f"per_template {rb['per_template']}: " + "; ".join(parts)
                                 + ". Its figures are void; re-register (docs/preregistered.md) rather than edit the list.")
    if subset == "all":
        ids = [e["id"] for e in doc["tasks"]]
    elif subset in ("seen", "held_out"):
        ids = [e["id"] for e in doc["tasks"] if e["group"] == subset]
    elif subset in doc["subsets"]:
        ids = list(doc["subsets"][subset])
    else:
        raise PreregisteredError(f"pre-registered test set: unknown subset {subset!r} (all, seen, held_out, "
                                 + ", ".join(sorted(doc["subsets"])) + ")")
    return [by_id[i] for i in ids]


def evaluation_tasks(split: str, *, n: int = 0, n_seen: int = 0, n_held_out: int = 0, seed: int = 0,
                     per_template: int = 0) -> list[Any]:
    """The tasks an evaluation runs: `select_tasks` for a split or task file; for "preregistered", the
    pre-registered list: the first `n_seen` of its seen part and the first `n_held_out` of its held-out part
    when either is set (32 + 16 = its "demo" subset), else `n` stratified of the whole list (0 = all 600).
    `seed`/`per_template` do not apply to it: the list records its own. Evaluation code only."""
    if split != PREREGISTERED:
        return select_tasks(split, n=n, n_seen=n_seen, n_held_out=n_held_out, seed=seed, per_template=per_template)
    listed = preregistered_tasks("all")
    if n_seen or n_held_out:
        seen = [t for t in listed if template_group(t.template) == "seen"]
        held = [t for t in listed if template_group(t.template) == "held_out"]
        if n_seen > len(seen) or n_held_out > len(held):
            raise PreregisteredError(f"pre-registered test set has {len(seen)} seen / {len(held)} held-out tasks, "
                                     f"asked for {n_seen} / {n_held_out}")
        return seen[:n_seen] + held[:n_held_out]
    return stratified(listed, n)
