"""Simulated training tasks: a seeded start state per task and one goal (change a field, create a row,
delete a row) with its gold calls; `run_gold` replays them (each task's quality check, the tests' oracle)."""
from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any

from mpa_jax.envs.contract import Action, Task, Verification
from mpa_jax.envs.simulated.catalog import SIM_ENTITIES, SIM_OPS

if TYPE_CHECKING:  # run_gold only calls the env it is given
    from mpa_jax.envs.simulated.env import SimulatedEnv


def _seed_rows(rng: random.Random) -> dict[str, dict[str, dict[str, Any]]]:
    """A whole start state drawn from `rng`: three rows `<entity>_1..3` in every table."""
    names = ["Kitchen", "Hallway", "Porch", "Office", "Garage", "Bedroom", "Den"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for e in SIM_ENTITIES:
        rows = {}
        for n in range(1, 4):
            row = {}
            for f in e.fields:
                if f.type == "bool":
                    row[f.name] = rng.random() < 0.5
                elif f.type == "enum":
                    row[f.name] = rng.choice(f.enum)
                elif f.type in ("int", "float"):
                    lo, hi = int(f.lo or 0), int(min(f.hi or 100, 100))
                    row[f.name] = rng.randint(lo, hi) if f.type == "int" else float(rng.randint(lo, hi))
                else:
                    row[f.name] = f"{rng.choice(names)} {e.label} {n}" if f.name in ("name", "title") else rng.choice(names)
            rows[f"{e.name}_{n}"] = {**row, "id": f"{e.name}_{n}"}
        out[e.table] = rows
    return out


def simulated_tasks(n: int, seed: int = 0) -> list[Task]:
    """`n` training tasks over the simulated apps: change a field, create a row, or delete a row."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        state = _seed_rows(random.Random(rng.random()))
        e = SIM_ENTITIES[i % len(SIM_ENTITIES)]
        rows = state[e.table]
        rid = rng.choice(sorted(rows))
        kind = ("update", "create", "delete")[i % 3]
        label = rows[rid].get("name") or rows[rid].get("title") or rid
        editable = [f for f in e.fields if f.type in ("bool", "enum", "int")]
        if kind == "update" and editable:
            f = rng.choice(editable)
            cur = rows[rid][f.name]
            new = (not cur) if f.type == "bool" else rng.choice([x for x in f.enum if x != cur] or [cur]) if f.type == "enum" \
                else int(min(f.hi or 100, max(f.lo or 0, (cur or 0) + rng.randint(1, 9))))
            instruction = f"Set {f.name.replace('_', ' ')} of the {e.label} {label!r} to {json.dumps(new)}."
            goals = [{"kind": "field", "table": e.table, "id": rid, "values": {f.name: new}, "name": "changed"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_list_{e.name}", "arguments": {}},
                    {"kind": "tool_call", "name": f"{e.app}_update_{e.name}", "arguments": {"id": rid, f.name: new}}]
        elif kind == "delete" or not editable:
            instruction = f"Remove the {e.label} {label!r}."
            goals = [{"kind": "deleted", "table": e.table, "id": rid, "name": "deleted"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_list_{e.name}", "arguments": {}},
                    {"kind": "tool_call", "name": f"{e.app}_delete_{e.name}", "arguments": {"id": rid}}]
        else:
            first = e.fields[0]
            value = f"New {e.label} {i}" if first.type == "str" else rows[rid][first.name]
            instruction = f"Add a {e.label} with {first.name} {json.dumps(value)}."
            goals = [{"kind": "new_row", "table": e.table, "match": {first.name: value}, "name": "created"}]
            gold = [{"kind": "tool_call", "name": f"{e.app}_create_{e.name}", "arguments": {first.name: value}}]
        gold.append({"kind": "message", "text": "Done."})
        tools = [f"{e.app}_{op}_{e.name}" for op in SIM_OPS]
        tasks.append(Task(id=f"sim/{e.table}.{kind}/{seed}-{i}", domain=e.domain, category="tool_use", difficulty=1,
                          instruction=instruction, tools=tools, verifier={"goals": goals}, gold=gold,
                          template=f"sim.{e.name}.{kind}", split="train", seed=seed * 100_003 + i,
                          metadata={"env": "simulated", "sim_state": state}))
    return tasks


def run_gold(env: SimulatedEnv, task: Task) -> Verification:
    """Replay a simulated task's gold calls (its quality check and the oracle for tests)."""
    env.reset(task)
    for g in task.gold:
        env.step(Action.tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else Action.message(g["text"]))
    return env.verify()
