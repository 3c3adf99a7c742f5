"""Persistent long-history memory for the harness (no jax): store, context provider, planner tools, suites.

The seam with the harness runtime (everything below is importable from `mpa_jax.harness.memory`):

(a) Store. `MemoryStore(path)`: SQLite (WAL) + FTS5 at `path` (":memory:" for a throwaway one).
    `ingest_turn(session, ts, role, content)` / `ingest_many([...])` store turns (ISO timestamps) and the
    facts a user turn states; `write_fact(attribute, value, kind=fact|preference|instruction|event, ts=...)`;
    `facts(attribute=None, query="")` -> current `Fact`s, each with its older values in `history` (the newer
    fact wins); `between(start, end, query="")` time-range reads; `search(query, since=, until=)` ->
    `SearchResult(hits, facts, abstain, reason)`, where `abstain` is the confident "nothing known" signal.
(b) Context provider. `MemoryContext(store).context(query, budget_tokens) -> str` (or `.snippets(...)` ->
    list[str]): call it while building the planner's context; it stays within `budget_tokens`
    (`estimate_tokens` = ceil(chars/4)) and starts with NOTHING_KNOWN when memory holds nothing on the query.
(c) Tools. `MemoryTools(store, session=..., clock=...)`: `specs()` -> [ToolSpec memory_search, memory_write]
    (JSON Schema, additionalProperties false); `call(name, arguments, call_id="") -> Feedback`, never raising:
    bad arguments -> INVALID_ARGUMENTS, an unknown name -> UNKNOWN_TOOL, a store failure -> INFRA.
    `MemoryTools.names()` tells the registry which calls to route here.
(d) Episodes. `memory_for_task(task)` -> (store, tools) holding the Task's `history` (Memory-category tasks):
    with the harness on, the planner can `memory_search` the history instead of reading it all in its prompt.
(e) All of it as one harness provider: `MemoryProvider(path=None, budget_tokens=512)` has the registry's
    ToolProvider shape (`source = "memory"`, `specs()`, `call(name, args, call_id)`) plus `context(task, query)`
    (the memory block for the episode's request; "" when memory abstains) and `observe(task, action, feedback)`,
    the hooks the runtime (i14's `HarnessSession.add_provider`) looks for. Without a path each episode gets an
    in-memory store of its Task's history; with one, a persistent store shared by all episodes.

Suites and evaluation: `suite.write_suite` (BEAM-style histories, `mpa memory suite`), `evaluate.evaluate_suite`
(`mpa memory eval`). See docs/memory.md.
"""
from mpa_jax.harness.memory.context import MemoryContext, long_context
from mpa_jax.harness.memory.episode import ingest_history, memory_for_task, task_now
from mpa_jax.harness.memory.provider import MemoryProvider
from mpa_jax.harness.memory.store import (NOTHING_KNOWN, Fact, Hit, MemoryStore, SearchResult, estimate_tokens,
                                          extract_facts)
from mpa_jax.harness.memory.tools import SPECS, MemoryTools

__all__ = [
    "NOTHING_KNOWN", "SPECS", "Fact", "Hit", "MemoryContext", "MemoryProvider", "MemoryStore", "MemoryTools",
    "SearchResult",
    "estimate_tokens", "extract_facts", "ingest_history", "long_context", "memory_for_task", "task_now",
]
