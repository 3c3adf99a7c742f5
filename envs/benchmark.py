"""Splits of the sandbox benchmark: generation, caching and loading.

Splits are separated by generator seed (disjoint seed ranges and disjoint persona worlds per split) and
by template: about one template in eight is held out of train entirely. Generation is deterministic:
the same seed and code give the same bytes. Generated splits are cached on disk under
$MPA_JAX_CACHE (default ~/.cache/mpa_jax)/tasks, keyed by split, seed, per-template count and a hash of
the generator's source, so repeat loads are fast and a code change never serves stale tasks.
"""
from __future__ import annotations

import collections
import hashlib
import os
import pathlib
import random
from typing import Any, Callable, Iterable, Sequence

from mpa_jax.envs.contract import CATEGORIES, DOMAINS, SPLITS, ContractError, Task, read_jsonl
from mpa_jax.envs.gate import check_task
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.envs.taskgen import GENERATOR_VERSION, TEMPLATES, Ctx, Template
from mpa_jax.envs.tools import TOOLS
from mpa_jax.envs.world import stable_hash
from mpa_jax.files import write_jsonl

PERSONAS: dict[str, tuple[int, ...]] = {"train": (0, 1, 2, 3, 4, 5), "dev": (10, 11), "test": (20, 21, 22, 23)}
FRESH_PERSONA_BASE = 1_000  # persona worlds of no split, from here up (RL's fresh worlds: rl.select_worlds)
SEED_BASE = {"train": 0, "dev": 1_000_000, "test": 2_000_000}
DEFAULT_PER_TEMPLATE = {"train": 4, "dev": 1, "test": 4}
MAX_ATTEMPTS = 6  # candidate draws per wanted task before a template gives up


def _used_tools(plan: Iterable[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for s in plan:
        if s["kind"] == "tool_call":
            out.append(s["name"])
            out += _used_tools(s.get("fallbacks", []))
    return out


def build_task(t: Template, split: str, seed: int, personas: Sequence[int] | None = None) -> Task | None:
    """Instantiate template `t` for `split` with instance seed `seed` (None when the draw is unusable), in one of
    the split's persona worlds or of `personas` (worlds of no split: FRESH_PERSONA_BASE and up)."""
    rng = random.Random(stable_hash(t.name, split, seed))
    personas = PERSONAS[split] if personas is None else tuple(personas)
    persona_seed = personas[rng.randrange(len(personas))]
    spec = t.fn(Ctx(persona_seed, rng))
    if spec is None:
        return None
    roles = spec.get("roles", {})
    used = list(dict.fromkeys(_used_tools(spec["gold"]) + spec.get("extra_tools", [])))
    if roles:
        tools = list(dict.fromkeys(used + [n for r in roles.values() for n in r]))
    else:
        apps = {TOOLS[n].spec.app for n in used}
        siblings = sorted(n for n, tl in TOOLS.items() if tl.spec.app in apps and n not in used)
        others = sorted(n for n, tl in TOOLS.items() if tl.spec.app not in apps)
        k_sib = 2 if t.difficulty < 3 else 4
        tools = used + rng.sample(siblings, min(k_sib, len(siblings))) + rng.sample(others, 1 if t.difficulty < 3 else 3)
        rng.shuffle(tools)
    meta = {"apps": sorted({TOOLS[n].spec.app for n in used}), "generator_version": GENERATOR_VERSION}
    if t.family:
        meta["skill"] = t.family
    meta.update(spec.get("metadata", {}))
    return Task(
        id=f"{split}/{t.name}/{seed}", domain=t.domain, category=t.category, difficulty=t.difficulty,
        instruction=spec["instruction"], tools=tools, verifier=spec["verifier"], gold=spec["gold"],
        history=spec.get("history", []), roles=roles, initial_state=spec.get("initial_state", {}),
        faults=spec.get("faults", []), template=t.name, split=split, seed=seed, persona_seed=persona_seed, metadata=meta,
    )


def templates_for(split: str) -> list[Template]:
    return [t for t in TEMPLATES if not (split == "train" and t.held_out)]


def generate_split(split: str, seed: int = 0, per_template: int = 0, templates: list[str] | None = None,
                   progress: Callable[[int, int], None] | None = None, stats: dict[str, Any] | None = None) -> list[Task]:
    """Generate the gated tasks of `split`. `per_template` 0 = the split's default count (scaled by weight)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    env = SandboxEnv()
    ts = templates_for(split)
    if templates is not None:
        ts = [t for t in ts if t.name in set(templates)]
    base = per_template or DEFAULT_PER_TEMPLATE[split]
    out: list[Task] = []
    rejected: collections.Counter[str] = collections.Counter()
    reasons: dict[str, str] = {}
    for i, t in enumerate(ts):
        quota = max(1, round(base * t.weight))
        seen: set[str] = set()
        got = 0
        for k in range(quota * MAX_ATTEMPTS):
            if got >= quota:
                break
            inst = SEED_BASE[split] + seed * 100_000 + stable_hash(t.name) % 1000 * 50 + k
            task = build_task(t, split, inst)
            if task is None:
                continue
            key = f"{task.persona_seed}|{task.instruction}|{task.history}|{task.initial_state}"
            if key in seen:
                continue
            seen.add(key)
            reason = check_task(task, env)
            if reason is not None:
                rejected[t.name] += 1
                reasons.setdefault(t.name, reason)
                continue
            out.append(task)
            got += 1
        if progress is not None:
            progress(i + 1, len(ts))
    env.close()
    if stats is not None:
        stats["rejected"] = dict(rejected)
        stats["reasons"] = reasons
    return out


def _source_hash() -> str:
    """A digest of the generator's source (the packages file by file, in name order): part of the cache key."""
    here = pathlib.Path(__file__).parent
    files: list[pathlib.Path] = []
    for name in ("catalog.py", "world.py", "tools", "taskgen", "gate.py", "verify.py", "sandbox.py", "oracle.py",
                 "benchmark.py", "contract.py", "schema.py", "prompt.py", "render.py"):
        files += sorted((here / name).glob("*.py")) if (here / name).is_dir() else [here / name]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(here).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("MPA_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "mpa_jax"))) / "tasks"


def cache_path(split: str, seed: int = 0, per_template: int = 0) -> pathlib.Path:
    return cache_dir() / f"{split}-seed{seed}-n{per_template}-v{GENERATOR_VERSION}-{_source_hash()}.jsonl"


def load_tasks(split_or_path: str, seed: int = 0, per_template: int = 0, cache: bool = True,
               progress: Callable[[int, int], None] | None = None) -> list[Task]:
    """Tasks of a split ("train" | "dev" | "test"), generated once and cached, or of a JSONL file."""
    if split_or_path not in SPLITS:
        if not os.path.exists(split_or_path):
            raise ContractError(f"load_tasks: {split_or_path!r} is neither a split ({', '.join(SPLITS)}) nor an existing file")
        return read_jsonl(split_or_path, Task)
    path = cache_path(split_or_path, seed, per_template)
    if cache and path.exists():
        return read_jsonl(str(path), Task)
    tasks = generate_split(split_or_path, seed, per_template, progress=progress)
    if cache:
        try:
            write_jsonl(str(path), tasks)  # atomic: concurrent loaders never see a partial file
        except OSError:  # a read-only home is no reason to fail: the tasks are generated anyway
            pass
    return tasks


def counts_table(tasks: list[Task]) -> str:
    """Plain-text table of counts by domain x category, with totals and distinct tools used by gold."""
    c = collections.Counter((t.domain, t.category) for t in tasks)
    w = max(len(d) for d in DOMAINS)
    lines = [f"{'domain':<{w}} " + " ".join(f"{k:>9}" for k in CATEGORIES) + f" {'total':>7}"]
    for d in DOMAINS:
        row = [c[(d, k)] for k in CATEGORIES]
        lines.append(f"{d:<{w}} " + " ".join(f"{n:>9}" for n in row) + f" {sum(row):>7}")
    tot = [sum(c[(d, k)] for d in DOMAINS) for k in CATEGORIES]
    lines.append(f"{'total':<{w}} " + " ".join(f"{n:>9}" for n in tot) + f" {sum(tot):>7}")
    lines.append(f"tools used by gold: {len(tools_used(tasks))}; templates: {len({t.template for t in tasks})}")
    return "\n".join(lines)


def tools_used(tasks: list[Task]) -> set[str]:
    out: set[str] = set()
    for t in tasks:
        out.update(_used_tools(t.gold))
    return out
