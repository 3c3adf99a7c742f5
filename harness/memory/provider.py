"""Memory as one harness tool provider (the registry's ToolProvider shape, plus `context` and `observe`).

    provider = MemoryProvider()                   # one in-memory store per episode, from the Task's history
    provider = MemoryProvider("runs/x/memory.sqlite")  # one persistent store shared by every episode
    session.add_provider(provider)                # harness runtime: tools offered, context added, steps observed

The runtime calls `context(task, query)` when it builds an episode's first context: that opens (or reuses)
the episode's memory and returns the memory block for the request (empty when memory abstains). Tool calls
`call(name, args, call_id)` go to the memory of the episode last opened on the calling thread, since the
call carries no task; `observe(task, action, feedback)` keeps what the planner told the user as assistant
turns of that episode's memory.
"""
from __future__ import annotations

import collections
import threading
from typing import Any

from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec
from mpa_jax.harness.memory.context import MemoryContext
from mpa_jax.harness.memory.episode import ingest_history, task_now
from mpa_jax.harness.memory.store import NOTHING_KNOWN, MemoryStore
from mpa_jax.harness.memory.tools import SPECS, MemoryTools


class MemoryProvider:
    """Memory tools + context for harness episodes. `path=None`: a fresh in-memory store per episode holding
    the Task's history; a path: one persistent store (WAL) for all episodes, each Task's history ingested once
    under session "task:<id>". `budget_tokens` bounds the context block; at most `keep` episodes stay open."""

    source = "memory"

    def __init__(self, path: str | None = None, *, budget_tokens: int = 512, keep: int = 64) -> None:
        if budget_tokens < 32:
            raise ValueError(f"memory budget_tokens must be at least 32, got {budget_tokens}")
        self.path = path
        self.budget_tokens = budget_tokens
        self.keep = keep
        self._lock = threading.Lock()
        self._local = threading.local()
        self._episodes: collections.OrderedDict[str, MemoryTools] = collections.OrderedDict()
        self._shared: MemoryStore | None = MemoryStore(path) if path else None

    @classmethod
    def from_config(cls, harness_cfg: Any) -> "MemoryProvider":
        """From the harness settings (`HarnessConfig`, i.e. `config.harness`): `memory_store` ("" = one in-memory
        store per episode) and `memory_tokens` (the block's budget)."""
        return cls(harness_cfg.memory_store or None, budget_tokens=int(harness_cfg.memory_tokens))

    def specs(self) -> list[ToolSpec]:
        return list(SPECS)

    def open(self, task: Task) -> MemoryTools:
        """The episode's memory tools (created on first use) and make it this thread's current episode."""
        with self._lock:
            tools = self._episodes.get(task.id)
            if tools is None:
                tools = self._new(task)
                self._episodes[task.id] = tools
                while len(self._episodes) > self.keep:
                    _, old = self._episodes.popitem(last=False)
                    if self._shared is None:
                        old.store.close()
            self._episodes.move_to_end(task.id)
        self._local.task_id = task.id
        return tools

    def _new(self, task: Task) -> MemoryTools:
        now = task_now(task)
        if self._shared is None:
            store = MemoryStore(":memory:")
            ingest_history(store, task.history, now)
        else:
            store = self._shared
            session = f"task:{task.id}"
            seen = store.conn.execute("SELECT 1 FROM meta WHERE key = ?", (session,)).fetchone()
            if not seen and task.history:
                ingest_history(store, task.history, now, session=session)
                store.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, '1')", (session,))
        return MemoryTools(store, session=f"episode:{task.id}", clock=lambda: now)

    def context(self, task: Task, query: str = "") -> str:
        """The memory block for this episode's request (the instruction), or "" when memory knows nothing."""
        tools = self.open(task)
        if tools.store.count() == 0:
            return ""
        text = MemoryContext(tools.store).context(task.instruction or query, self.budget_tokens)
        if not text or text.startswith(NOTHING_KNOWN):
            return ""
        return ("Memory (from earlier conversations; memory_search looks up more):\n" + text)

    def call(self, name: str, args: Any, call_id: str = "") -> Feedback:
        """Run a memory tool in the calling thread's current episode; never raises."""
        tid = getattr(self._local, "task_id", None)
        tools = self._episodes.get(tid) if tid is not None else None
        if tools is None:
            return Feedback.error(ErrorCode.PRECONDITION_FAILED, f"{name}: no memory is open for this episode", call_id,
                                  hint="the harness opens memory when it builds the episode's context")
        return tools.call(name, args, call_id)

    def observe(self, task: Task, action: Action, feedback: Feedback) -> None:
        """Remember what the planner told the user (message actions) as assistant turns of the episode."""
        if action.kind != "message" or not action.text.strip():
            return
        tools = self.open(task)
        tools.store.ingest_turn(tools.session, tools.clock(), "assistant", action.text, extract=False)

    def close(self) -> None:
        with self._lock:
            if self._shared is None:
                for t in self._episodes.values():
                    t.store.close()
            self._episodes.clear()
            if self._shared is not None:
                self._shared.close()
                self._shared = None
