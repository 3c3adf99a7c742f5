"""What the planner reads from memory: a budgeted context block for a query, and the long-context
baseline (the most recent history that fits the same budget) it is measured against."""
from __future__ import annotations

from mpa_jax.harness.memory.store import NOTHING_KNOWN, Hit, MemoryStore, estimate_tokens


class MemoryContext:
    """Context provider the harness calls while building the planner's prompt.

    `context(query, budget_tokens)` returns one string of at most `budget_tokens` (estimated): current facts
    that match the query (with their older values), then the best turns in time order; or one line
    starting with NOTHING_KNOWN when the store abstains. `snippets` is the same as a list.
    """

    def __init__(self, store: MemoryStore, *, limit: int = 24) -> None:
        self.store = store
        self.limit = limit

    def snippets(self, query: str, budget_tokens: int) -> list[str]:
        res = self.store.search(query, limit=self.limit)
        if res.abstain:
            return [f"{NOTHING_KNOWN}: {res.reason}."]
        out: list[str] = []
        used = 0
        chosen: list[Hit] = []
        for f in res.facts:  # current facts, with the turn that stated each (the evidence a reader can cite)
            line = "fact: " + f.render()
            cost = estimate_tokens(line) + 1
            if used + cost > budget_tokens:
                continue
            out.append(line)
            used += cost
            src = self.store.turn(f.turn_id) if f.turn_id is not None else None
            if src is not None and all(src.turn_id != h.turn_id for h in chosen):
                cost = estimate_tokens(src.render()) + 1
                if used + cost <= budget_tokens:
                    chosen.append(src)
                    used += cost
        for h in res.hits:  # best first until the budget is spent, then shown in time order
            if any(h.turn_id == c.turn_id for c in chosen):
                continue
            cost = estimate_tokens(h.render()) + 1
            if used + cost > budget_tokens:
                continue
            chosen.append(h)
            used += cost
        chosen.sort(key=lambda h: (h.ts, h.turn_id))
        return out + [h.render() for h in chosen]

    def context(self, query: str, budget_tokens: int) -> str:
        """The memory block for `query` within `budget_tokens` (ceil(chars/4) estimate)."""
        return "\n".join(self.snippets(query, budget_tokens))


def long_context(store: MemoryStore, budget_tokens: int) -> str:
    """The baseline: the most recent turns that fit `budget_tokens`, oldest first, rendered like memory hits."""
    return "\n".join(h.render() for h in store.recent(budget_tokens))
