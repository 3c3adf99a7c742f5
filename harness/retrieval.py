"""Tool retrieval: the k most relevant tools of the whole catalog for a request and its history.

A lexical BM25 index over each tool's text (name words, app, domain, entity label, description,
parameter names) — fast (well under a millisecond per query), deterministic and dependency free.
Two structural rules on top, because a good tool set is a *plan*, not a bag of words:

- companions: a table tool that is picked brings its entity's `search_*` and `get_*` (ids come from
  a search; details from a get), so "text Alex" also surfaces `search_contacts`;
- `keep`: tools already in use come first, so a re-retrieval never drops a tool being used.

Used by the runtime (`harness.tools = "catalog"`) and by `bench/tool_retrieval.py`.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Iterable, Sequence

from mpa_jax.envs.contract import ToolSpec

_WORD = re.compile(r"[a-z0-9]+")
_QUOTED = re.compile(r'"[^"]*"')
_CURRENCY = re.compile(r"\b(?:USD|EUR|GBP|JPY|CHF|MXN|AUD|CAD|CNY|INR|SEK|NOK|DKK|BRL|KRW|SGD|HKD|NZD|ZAR|PLN)\b")
_STOP = frozenset(
    "a an the of to and or for in on at by with from my me i is it be as that this what which who please "
    "can you your one all are was".split()
)
# Words users say for things the catalog names differently (kept small and generic).
_SYNONYMS = {
    "text": "send sms", "texts": "send sms", "txt": "send sms", "order": "place product cart",
    "say": "translate", "language": "translate", "italian": "translate", "spanish": "translate", "french": "translate",
    "german": "translate", "japanese": "translate", "portuguese": "translate", "chinese": "translate", "korean": "translate", "mail": "email", "emails": "email",
    "phone": "call contact", "ring": "call", "wake": "alarm", "remind": "reminder", "appointment": "event calendar",
    "meeting": "event calendar", "song": "music play", "music": "song play", "cab": "ride", "taxi": "ride",
    "uber": "ride", "pay": "payment bill", "send": "send", "money": "transfer", "kg": "convert units",
    "pounds": "convert units", "miles": "convert units", "km": "convert units", "forecast": "weather",
    "temperature": "weather", "buy": "order cart", "directions": "route", "drive": "route",
    "tip": "calculate", "split": "calculate", "percent": "calculate", "sum": "calculate", "total": "calculate",
    "cycling": "route", "walking": "route", "driving": "route", "transit": "route", "commute": "route",
    "weigh": "convert units", "weight": "convert units", "liters": "convert units", "gallons": "convert units",
    "celsius": "convert units", "fahrenheit": "convert units", "ounces": "convert units", "inches": "convert units",
}


def tokenize(text: str, expand: bool = False) -> list[str]:
    """Lower-case words without stop words; a plural 's' is also indexed without it; `expand` adds
    the synonyms users say (queries only: tool texts use the catalog's own words)."""
    out: list[str] = []
    if expand and _CURRENCY.search(text):
        out += ["convert", "currency"]
    for w in _WORD.findall(text.lower()):
        if w in _STOP:
            continue
        out.append(w)
        if len(w) > 3 and w.endswith("s"):
            out.append(w[:-1])
        syn = _SYNONYMS.get(w) if expand else None
        if syn:
            out += syn.split()
    return out


def tool_text(spec: ToolSpec, label: str = "") -> str:
    """The text a tool is indexed by: its name words and entity label weigh most; parameter names are
    only indexed for tools without an entity (on table tools they are every field of the table and
    would match any request that names a field)."""
    params = spec.parameters.get("properties", {}) if isinstance(spec.parameters, dict) else {}
    words = spec.name.replace("_", " ")
    parts = [words, words, label, label, spec.app, spec.description]
    if not label:
        parts.append(" ".join(params))
    return " ".join(parts)


class ToolIndex:
    """BM25 over tool texts with companion expansion. `search(query, k)` -> tool names, best first."""

    def __init__(self, specs: Iterable[ToolSpec], k1: float = 1.2, b: float = 0.75,
                 companions: dict[str, list[str]] | None = None, ops: dict[str, str] | None = None,
                 companion_weight: float = 1.0, labels: dict[str, str] | None = None,
                 prior: Sequence[str] = ()) -> None:
        self.specs = {s.name: s for s in specs}
        self.prior = list(prior)
        labels = labels or {}
        self.companions = companions or {}
        self.ops = dict(ops or {})
        self.companion_weight = companion_weight
        self.names = list(self.specs)
        self.docs = [Counter(tokenize(tool_text(self.specs[n], labels.get(n, "")))) for n in self.names]
        self.lens = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lens) / max(1, len(self.lens))
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.k1, self.b = k1, b
        self._postings: dict[str, list[int]] = {}
        for i, d in enumerate(self.docs):
            for w in d:
                self._postings.setdefault(w, []).append(i)

    def scores(self, query: str) -> dict[int, float]:
        # Quoted values (names, titles, message bodies) say little about which tool to use.
        q = Counter(tokenize(_QUOTED.sub(" ", query), expand=True))
        out: dict[int, float] = {}
        for w, qf in q.items():
            idf = self.idf.get(w)
            if idf is None:
                continue
            for i in self._postings[w]:
                tf = self.docs[i][w]
                norm = tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * self.lens[i] / self.avg))
                out[i] = out.get(i, 0.0) + idf * norm * (1 + 0.2 * (qf - 1))
        return out

    def search(self, query: str, k: int = 8, keep: Sequence[str] = (), allowed: Iterable[str] | None = None) -> list[str]:
        """The k best tools for `query`; `keep` (tools already in use) come first; `allowed` filters.

        A companion inherits `companion_weight` of the best score of the tools that bring it, and the
        verbs of the request favour the matching operation (create/update/delete/read).
        """
        allow = set(allowed) if allowed is not None else None
        base = {self.names[i]: s for i, s in self.scores(query).items()}
        boost = _op_boost(query)
        for name in base:
            base[name] *= boost.get(self.ops.get(name, ""), 1.0)
        final = dict(base)
        for name, s in base.items():
            for comp in self.companions.get(name, ()):
                if comp in self.specs:
                    final[comp] = max(final.get(comp, 0.0), s * self.companion_weight)
        ranked = sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))
        picked = [n for n in dict.fromkeys(keep) if n in self.specs and (allow is None or n in allow)]
        for name in [n for n, _ in ranked] + self.prior:  # too few matches: fill with the most used tools
            if len(picked) >= k:
                break
            if name not in picked and name in self.specs and (allow is None or name in allow):
                picked.append(name)
        return picked[:k]


_OPS_BY_VERB = {
    "create": "new add create save make schedule book log start plan".split(),
    "update": "change update rename move edit mark reschedule switch turn".split(),
    "delete": "delete remove cancel clear erase drop".split(),
    "read": "what which when where find look show tell how list check".split(),
}


def _op_boost(query: str) -> dict[str, float]:
    words = set(_WORD.findall(_QUOTED.sub(" ", query.lower())))
    out: dict[str, float] = {}
    for op, verbs in _OPS_BY_VERB.items():
        if words & set(verbs):
            for o in (("search", "get") if op == "read" else (op,)):
                out[o] = 1.3
    return out


def catalog_companions() -> dict[str, list[str]]:
    """Per sandbox tool, the tools a plan with it usually also needs: its entity's search/get (ids come
    from a search), the search of every entity it refers to (a booking needs the hotel's id), and
    `search_contacts` for tools that reach a person."""
    from mpa_jax.envs.catalog import ENTITY_BY_NAME
    from mpa_jax.envs.tools import TOOLS

    by_entity: dict[str, dict[str, str]] = {}
    for name, tool in TOOLS.items():
        if tool.entity is not None and tool.op:
            by_entity.setdefault(tool.entity.name, {})[tool.op] = name
    out: dict[str, list[str]] = {}
    for name, tool in TOOLS.items():
        comp: list[str] = []
        if tool.entity is not None:
            ops = by_entity.get(tool.entity.name, {})
            if tool.op != "search" and "search" in ops:
                comp.append(ops["search"])
            if tool.op in ("search", "update", "delete") and "get" in ops:
                comp.append(ops["get"])
            if tool.op == "create":
                for f in tool.entity.fields:
                    if f.ref and f.ref in ENTITY_BY_NAME and "search" in by_entity.get(f.ref, {}):
                        comp.append(by_entity[f.ref]["search"])
        props = tool.spec.parameters.get("properties", {})
        if any(p in props for p in ("to", "contact_id", "recipient", "payee_id")) and "search_contacts" in TOOLS:
            comp.append("search_contacts")
        out[name] = list(dict.fromkeys(c for c in comp if c != name))
    return out


def request_query(messages: Sequence[dict[str, Any]]) -> str:
    """The retrieval query of a chat: user turns (request and history) and assistant text, newest weighted."""
    parts = []
    for m in messages:
        if m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str):
            parts.append(m["content"])
    if parts:
        parts += [parts[-1]] * 2  # the request itself counts three times as much as older turns
    return "\n".join(parts)


_INDEX: dict[bool, ToolIndex] = {}


def train_statistics() -> tuple[dict[str, list[str]], list[str]]:
    """Companions learned from the gold plans of the train split (never dev/test), and its tools by use."""
    from mpa_jax.envs.benchmark import _used_tools, load_tasks

    plans = [_used_tools(t.gold) for t in load_tasks("train")]
    uses = Counter(n for p in plans for n in set(p))
    return learn_companions(plans), [n for n, _ in uses.most_common()]


def catalog_index(learned: bool = True) -> ToolIndex:
    """The index over the sandbox's whole catalog (built once per process); `learned` adds the
    train-split co-occurrence companions to the structural ones."""
    if learned not in _INDEX:
        from mpa_jax.envs.tools import TOOLS

        comps, prior = catalog_companions(), list(TOOLS)
        if learned:
            learned_comps, prior = train_statistics()
            comps = merge_companions(comps, learned_comps)
        _INDEX[learned] = ToolIndex((t.spec for t in TOOLS.values()), companions=comps,
                           ops={n: t.op for n, t in TOOLS.items()},
                           labels={n: t.entity.label for n, t in TOOLS.items() if t.entity is not None}, prior=prior)
    return _INDEX[learned]


def learn_companions(plans: Iterable[Sequence[str]], min_p: float = 0.5, min_count: int = 3) -> dict[str, list[str]]:
    """Co-occurrence companions learned from gold plans (train split only): b is a companion of a when
    at least `min_p` of the plans that use a (and `min_count` of them) also use b."""
    uses: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for plan in plans:
        tools = set(plan)
        uses.update(tools)
        for a in tools:
            for b in tools:
                if a != b:
                    pairs[(a, b)] += 1
    out: dict[str, list[str]] = {}
    for (a, b), c in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])):
        if c >= min_count and c / uses[a] >= min_p:
            out.setdefault(a, []).append(b)
    return out


def merge_companions(*maps: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = list(dict.fromkeys([*out.get(k, []), *v]))
    return out
