"""The benchmark's fingerprint: generated tasks, the tool catalog and what the tools do, pinned by hash.

The task generators (`envs/taskgen/`) and the tools (`envs/tools/`) are code that many results depend on
(the shipped starter's dev success, every SFT dataset): a refactor that reorders templates, rewords an
instruction, changes a schema or a tool's result must be a deliberate decision, not an accident. The test
regenerates every template once per split (order included), dumps every ToolSpec, and replays every
generated task's gold through the real sandbox with the oracle (SQLite world, faults, preconditions),
then compares sha256 digests with the ones stored below.

A deliberate change: run `XLA_FLAGS= .venv/bin/python tests/unit/test_envs_fingerprint.py` and paste the
printed digests into PINNED (say why in the commit message). `--full` also prints the digests of the
full default splits (train/dev/test, all tasks) and of oracle replays over them: the check a refactor
should pass before and after (it takes a few minutes).
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
from typing import Any

from mpa_jax.envs import Action, Task, canonical_json, generate_split, make_env, run_oracle_episode
from mpa_jax.envs.taskgen import TEMPLATES
from mpa_jax.envs.tools import DELEGATE_SPEC, TOOLS, TRANSFER_LIMIT

# Regenerate with `python tests/unit/test_envs_fingerprint.py` (see the module docstring).
PINNED = {
    "templates": "0bbf09c928c71fa225534b4d550f0ff219e2df827a590d0b5c0e4a2dfe140802",
    "tasks-train-n1": "ea2092519c143d3e0b6436fca319ca0400b895d742fe78b202a3c5e822b6604d",
    "tasks-dev-n1": "47082571ea93a529292cc3868c57577887843983f3f70a466882578cfe23a3fe",
    "tasks-test-n1": "e35dc9a93a36777db65d981327b8207fc2ed6bc3e51a09b53d7334becf47995b",
    "catalog": "6c47bbd80d128ef7d25161b7a131c811f8ced3888f86084e91a942f967601245",
    "oracle-dev-n1": "b3ed2b5440ce88d00b86e8c5a9a83d73ee6165bb1f3bf9f7fe63e7d933ca1815",
    "probes": "b34f61ef4fa2bf09d28339b3c952092435ed2c903a5756fdfd64a96b23274925",
}


def _sha(lines: list[str]) -> str:
    h = hashlib.sha256()
    for s in lines:
        h.update(s.encode("utf-8") + b"\n")
    return h.hexdigest()


def templates_digest() -> str:
    """Every template's registration record, in registration order (the order tasks appear in a split)."""
    return _sha([canonical_json({"name": t.name, "domain": t.domain, "category": t.category, "difficulty": t.difficulty,
                                 "weight": t.weight, "family": t.family, "held_out": t.held_out}) for t in TEMPLATES])


def tasks_digest(tasks: list[Task]) -> str:
    return _sha([canonical_json(t.to_dict()) for t in tasks])  # content only: gold argument order is not hashed


def catalog_digest() -> str:
    """Every ToolSpec in registration order, with the executor's entity/op binding, and the delegate spec."""
    rows = [canonical_json({"spec": t.spec.to_dict(), "pre": list(t.preconditions), "entity": t.entity.name if t.entity else None,
                            "op": t.op}) for t in TOOLS.values()]
    return _sha(rows + [DELEGATE_SPEC.to_json(), repr(TRANSFER_LIMIT)])


def oracle_digest(tasks: list[Task]) -> str:
    """Each task's gold replayed by the oracle (seeded variation) in the real sandbox: chat, steps, verdict, ledger."""
    env = make_env("sandbox")
    out = []
    for i, t in enumerate(tasks):
        ep = run_oracle_episode(env, t, seed=i)
        out.append(canonical_json({"id": ep.task_id, "messages": ep.messages, "tools": ep.tools,
                                   "steps": [s.to_dict() for s in ep.steps], "verification": ep.verification.to_dict(),
                                   "ledger": ep.ledger_hash}))
    env.close()
    return _sha(out)


def _sample(schema: dict[str, Any], rng: random.Random) -> Any:
    """A seeded value for a parameter schema: mostly valid, sometimes out of range or of the wrong shape."""
    t = schema.get("type")
    if "enum" in schema:
        return rng.choice(list(schema["enum"]) + ["bogus"])
    if t == "string":
        pat = schema.get("pattern", "")
        if pat.startswith("^") and "_[0-9]+$" in pat:
            return f"{pat[1:pat.index('_[0-9]')]}_{rng.randint(0, 12)}"
        if "\\d{4}" in pat:
            return rng.choice(["2026-03-01", "2026-03-12", "2026-04-15", "2026-13-40"])
        if "[01]" in pat:
            return rng.choice(["09:30", "23:59", "25:00"])
        return rng.choice(["contact_3", "+1-555-123-4567", "kg", "lb", "km", "mi", "C", "F", "a@b.com", "Lisbon", "Tokyo",
                           "2*(3+4)", "10 / 0", "thank you", "good morning", "standard", "Main St 5", "x", "coffee"])
    if t == "integer":
        return rng.randint(int(schema.get("minimum", -5)) - 1, int(schema.get("maximum", 100)) + 1)
    if t == "number":
        return rng.choice([0.5, 3, 12.5, 70, 250, 1999.5, 2500, -4])
    if t == "boolean":
        return rng.random() < 0.5
    return None


def probes_digest(calls_per_tool: int = 6) -> str:
    """Every tool called with seeded arguments in one sandbox world (state carries over): each Feedback, then the ledger."""
    task = Task(id="probe", domain="utilities", category="tool_use", difficulty=1, instruction="probe", tools=list(TOOLS),
                verifier={"goals": []}, gold=[], persona_seed=5)
    env = make_env("sandbox")
    env.reset(task)
    rng = random.Random(0)
    out = []
    for name, tool in TOOLS.items():
        props = tool.spec.parameters["properties"]
        req = set(tool.spec.parameters.get("required", ()))
        for _ in range(calls_per_tool):
            args = {k: _sample(v, rng) for k, v in props.items() if k in req or rng.random() < 0.5}
            out.append(canonical_json(env.step(Action.tool_call(name, args)).to_dict()))
    out.append(env.ledger_hash)
    env.close()
    return _sha(out)


def fingerprint() -> dict[str, str]:
    """The digests the test pins: every template once per split, the catalog, oracle replays, tool probes."""
    fp = {"templates": templates_digest()}
    for split in ("train", "dev", "test"):
        tasks = generate_split(split, per_template=1)
        fp[f"tasks-{split}-n1"] = tasks_digest(tasks)
        if split == "dev":
            fp["oracle-dev-n1"] = oracle_digest(tasks)
    fp["catalog"] = catalog_digest()
    fp["probes"] = probes_digest()
    return fp


def full_fingerprint() -> dict[str, str]:
    """The default splits in full and oracle replays over all their tasks (minutes; run by hand around a refactor)."""
    fp = {}
    for split in ("train", "dev", "test"):
        tasks = generate_split(split)
        fp[f"split-{split}"] = tasks_digest(tasks)
        fp[f"split-{split}-count"] = str(len(tasks))
        fp[f"oracle-{split}"] = oracle_digest(tasks)
    return fp


def test_generated_tasks_catalog_and_tool_behaviour_match_the_pinned_fingerprint():
    got = fingerprint()
    changed = {k: got[k] for k in PINNED if got[k] != PINNED[k]}
    assert not changed, (f"the benchmark changed ({', '.join(changed)}); if deliberate, regenerate PINNED "
                         f"(python tests/unit/test_envs_fingerprint.py) and say why in the commit: {json.dumps(got, indent=1)}")


if __name__ == "__main__":
    print(json.dumps(fingerprint(), indent=1))
    if "--full" in sys.argv:
        print(json.dumps(full_fingerprint(), indent=1))
