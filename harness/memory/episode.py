"""Memory for one benchmark episode: a Task's `history` ingested into a store the planner can search."""
from __future__ import annotations

import datetime as dt
from typing import Any

from mpa_jax.envs.contract import Task
from mpa_jax.harness.memory.store import MemoryStore
from mpa_jax.harness.memory.tools import MemoryTools


def task_now(task: Task) -> str:
    """The episode's frozen clock: the task's device patch, else the persona's."""
    now = task.initial_state.get("device", {}).get("now")
    if now:
        return str(now)
    from mpa_jax.envs.world import persona_world

    return persona_world(task.persona_seed)[0].now


def ingest_history(store: MemoryStore, history: list[dict[str, Any]], now: str, session: str = "history") -> list[int]:
    """Store history turns; turns without "ts" get one minute apart, ending one minute before `now`.
    A turn's own "ts" and "session" keys win when present."""
    end = dt.datetime.fromisoformat(now)
    n = len(history)
    rows = []
    for i, turn in enumerate(history):
        ts = turn.get("ts") or (end - dt.timedelta(minutes=n - i)).strftime("%Y-%m-%dT%H:%M")
        rows.append((str(turn.get("session", session)), ts, str(turn["role"]), str(turn["content"])))
    return store.ingest_many(rows) if rows else []


def memory_for_task(task: Task, path: str = ":memory:") -> tuple[MemoryStore, MemoryTools]:
    """A store holding the task's history, and memory tools whose writes carry the episode's frozen clock."""
    now = task_now(task)
    store = MemoryStore(path)
    ingest_history(store, task.history, now)
    return store, MemoryTools(store, session=f"episode:{task.id}", clock=lambda: now)
