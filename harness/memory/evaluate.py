"""Evaluate memory on a suite: evidence recall of the context a planner would get, memory vs the
long-context baseline at the same token budget, and end-to-end answer accuracy with a reader.

Evidence recall of a question = the fraction of its evidence turns whose rendered line is in the context.
Abstention has no evidence turn: memory scores 1 when its context carries the NOTHING KNOWN signal; the
long-context baseline scores 1 only when the whole history fits the budget (otherwise it cannot know that
nothing was said).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import time
from typing import Any, Callable, Protocol

from mpa_jax.harness.memory.context import MemoryContext, long_context
from mpa_jax.harness.memory.store import NOTHING_KNOWN, MemoryStore
from mpa_jax.harness.memory.suite import ABILITIES, read_history, read_meta, read_questions


def ingest_suite(suite_dir: str, store_path: str, *, batch: int = 20_000,
                 progress: Callable[[int, int], None] | None = None) -> MemoryStore:
    """The suite's history in a store at `store_path`; an existing complete store of the same suite is reused
    (its meta table records the suite's meta.json), anything else there (a crashed ingest, another suite) is
    rebuilt."""
    meta = read_meta(suite_dir)
    store = MemoryStore(store_path)
    stamp = json.dumps(meta, sort_keys=True)  # a rewritten suite (other seed or size) invalidates the store
    done = store.conn.execute("SELECT value FROM meta WHERE key = 'suite_meta'").fetchone()
    if done and done[0] == stamp and store.count() == meta["turns"]:
        return store
    if store.count():
        store.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(store_path + suffix):
                os.remove(store_path + suffix)
        store = MemoryStore(store_path)
    rows, ids = [], []
    n = 0
    for t in read_history(suite_dir):
        rows.append((str(t["session"]), t["ts"], t["role"], t["content"]))
        ids.append(t["id"])
        if len(rows) >= batch:
            store.ingest_many(rows, ids=ids)
            n += len(rows)
            rows, ids = [], []
            if progress:
                progress(n, meta["turns"])
    if rows:
        store.ingest_many(rows, ids=ids)
    store.conn.execute("INSERT OR REPLACE INTO meta VALUES ('suite_meta', ?)", (stamp,))
    return store


def evidence_recall(q: dict[str, Any], context: str, lines: dict[int, str], whole_history_fits: bool = False) -> float:
    """Fraction of the question's evidence lines present in `context` (abstention: see the module doc)."""
    if q["ability"] == "abstention":
        return 1.0 if (NOTHING_KNOWN in context or whole_history_fits) else 0.0
    ev = q["evidence"]
    return sum(1 for t in ev if lines[t] in context) / len(ev)


# ----------------------------------------------------------------------------------------- readers


class Reader(Protocol):
    name: str

    def answer(self, question: dict[str, Any], context: str) -> str: ...


_LINE = re.compile(r"^\[(?P<ts>[0-9T:\-]+) session (?P<s>[^\]]*)\] (?P<role>\w+): (?P<text>.*)$")


def _lines(context: str, subject: str) -> list[tuple[str, str, str]]:
    """(ts, role, text) of the context's turn lines that mention `subject`, in time order."""
    out = []
    for raw in context.splitlines():
        m = _LINE.match(raw)
        if m and subject.lower() in m.group("text").lower():
            out.append((m.group("ts"), m.group("role"), m.group("text")))
    return sorted(out)


def _last_match(lines: list[tuple[str, str]], pattern: str, flags: int = 0) -> str:
    """Group 1 of `pattern` in the newest line that matches it, else "unknown"."""
    for _, text in reversed(lines):
        m = re.search(pattern, text, flags)
        if m:
            return m.group(1)
    return "unknown"


class ScriptedReader:
    """A deterministic extractive reader for tests and CPU figures: it answers only from the context's turn
    lines that mention the question's subject (the generator's `reader` hints), as a careful model would.
    It says "unknown" when the context has NOTHING KNOWN or no line about the subject."""

    name = "scripted"

    def answer(self, q: dict[str, Any], context: str) -> str:
        subj = q["reader"]["subject"]
        if NOTHING_KNOWN in context:
            return "unknown"
        users = [(ts, text) for ts, role, text in _lines(context, subj) if role == "user"]
        if not users:
            return "unknown"
        ab = q["ability"]
        if ab == "information_extraction":
            return _last_match(users, re.escape(subj) + r" is ([^.]+)\.", re.I)
        if ab == "knowledge_update":  # the newest statement of the attribute, not the newest mention
            return _last_match(users, re.escape(subj) + r" is (?:now )?([A-Z]\w+ [A-Z]\w+)")
        if ab == "contradiction_resolution":
            neg = any("never" in t.lower() for _, t in users)
            pos = any(re.search(r"\b(visited|again|my old)\b", t, re.I) and "never" not in t.lower() for _, t in users)
            return "conflicting" if neg and pos else ("no" if neg else "yes")
        if ab == "event_ordering":
            first: dict[str, str] = {}
            for ts, t in users:
                for opt in q["reader"]["options"]:
                    if opt in t and opt not in first:
                        first[opt] = ts
            known = sorted(first, key=lambda o: first[o])
            return ", ".join(known + [o for o in q["reader"]["options"] if o not in first])
        if ab == "instruction_following":  # the reply is written under the newest standing instruction
            return _last_match(users, r"((?:from now on|going forward|always|never)\b.*)", re.I)
        if ab == "preference_following":
            return _last_match(users, r"\b(?:prefer|like|love)\b(.*)", re.I)
        if ab == "multi_session_reasoning":
            if q["reader"].get("sum"):
                return str(sum(int(m.group(1)) for _, t in users for m in re.finditer(r"paid (\d+) dollars", t)))
            return str(len(users))
        if ab == "summarization":
            return " ".join(t for _, t in users)
        if ab == "temporal_reasoning":
            start = [ts for ts, t in users if re.search(r"\b(started|began)\b", t)]
            end = [ts for ts, t in users if re.search(r"\b(finished|done)\b", t)]
            if not start or not end:
                return "unknown"
            return str((dt.date.fromisoformat(end[-1][:10]) - dt.date.fromisoformat(start[0][:10])).days)
        return "unknown"


class PlannerReader:
    """Any harness planner backend as the reader: an object with `respond(messages, tools)` returning a reply
    with `.text` (branch i14's ScriptedPlanner, EnginePlanner on the embedded JAX engine, OpenAIChatPlanner)."""

    name = "planner"

    def __init__(self, planner: Any) -> None:
        self.planner = planner

    def answer(self, q: dict[str, Any], context: str) -> str:
        reply = self.planner.respond([{"role": "system", "content": _READER_PROMPT + context},
                                      {"role": "user", "content": q["question"]}], None)
        return str(getattr(reply, "text", "") or "")


_READER_PROMPT = ("You are a phone assistant answering from your memory of past conversations, shown below. "
                  "Answer briefly with the exact value. If memory says NOTHING KNOWN or does not contain the "
                  "answer, reply 'unknown'. If the memory holds statements that contradict each other, reply "
                  "'conflicting'. Follow any standing instruction or preference the memory shows.\n\nMemory:\n")


class OpenAIReader:
    """Any OpenAI-compatible chat endpoint (`mpa serve`, SGLang, vLLM, a hosted API) as the reader."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 120.0) -> None:
        import httpx

        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key or 'none'}"})

    def answer(self, q: dict[str, Any], context: str) -> str:
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 128,
                "messages": [{"role": "system", "content": _READER_PROMPT + context}, {"role": "user", "content": q["question"]}]}
        r = self.client.post(self.url, json=body)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"] or "")


def _words(s: Any) -> str:
    return " ".join(re.sub(r"[^a-z0-9\-]+", " ", str(s).lower()).split())


def score_answer(q: dict[str, Any], answer: str) -> float:
    """Score in [0, 1]: exact/number answers must appear as a whole phrase, orders must match exactly,
    key points score their coverage, instructions/preferences must show the required word."""
    kind, want, got = q["answer_kind"], q["answer"], _words(answer)
    if kind in ("exact", "must_mention", "conflict", "abstain"):
        w = _words(want)
        return 1.0 if re.search(r"(^| )" + re.escape(w) + r"($| )", got) else 0.0
    if kind == "number":
        nums = re.findall(r"-?\d+", got)
        return 1.0 if nums and int(nums[0]) == int(want) else 0.0
    if kind == "order":
        pos = [got.find(_words(s)) for s in want]
        return 1.0 if all(p >= 0 for p in pos) and pos == sorted(pos) else 0.0
    if kind == "keypoints":
        return sum(1 for k in want if _words(k) in got) / len(want)
    raise ValueError(f"unknown answer_kind {kind!r}")


# ----------------------------------------------------------------------------------------- eval


def _mean(xs: list[float]) -> float:
    return round(statistics.fmean(xs), 4) if xs else 0.0


def evaluate_suite(suite_dir: str, *, budget_tokens: int = 2048, store_path: str | None = None,
                   reader: Reader | None = None, store_kwargs: dict[str, Any] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run the evaluation; returns the report dict (see docs/memory.md for the layout)."""
    meta = read_meta(suite_dir)
    questions = read_questions(suite_dir)
    store_path = store_path or os.path.join(suite_dir, "memory.sqlite")
    t0 = time.perf_counter()
    store = ingest_suite(suite_dir, store_path, progress=(lambda d, n: progress("ingest", d, n)) if progress else None)
    for k, v in (store_kwargs or {}).items():
        setattr(store, k, v)
    ingest_s = time.perf_counter() - t0
    need = {t for q in questions for t in q["evidence"]}
    lines: dict[int, str] = {}
    for t in need:
        h = store.turn(t)
        if h is None:
            raise ValueError(f"suite {suite_dir}: evidence turn {t} is not in the history")
        lines[t] = h.render()
    baseline = long_context(store, budget_tokens)
    fits = store.count() == len(baseline.splitlines()) if baseline else store.count() == 0
    provider = MemoryContext(store)
    per_q: list[dict[str, Any]] = []
    lat: list[float] = []
    for i, q in enumerate(questions):
        t1 = time.perf_counter()
        ctx = provider.context(q["question"], budget_tokens)
        lat.append(time.perf_counter() - t1)
        row = {"id": q["id"], "ability": q["ability"], "paraphrased": bool(q.get("paraphrased", False)),
               "memory_recall": evidence_recall(q, ctx, lines),
               "long_context_recall": evidence_recall(q, baseline, lines, fits)}
        if reader is not None:
            a_mem, a_lc = reader.answer(q, ctx), reader.answer(q, baseline)
            row.update(memory_answer=a_mem, memory_correct=score_answer(q, a_mem),
                       long_context_answer=a_lc, long_context_correct=score_answer(q, a_lc))
        per_q.append(row)
        if progress:
            progress("questions", i + 1, len(questions))
    store.close()

    def table(key: str) -> dict[str, float]:
        out = {ab: _mean([r[key] for r in per_q if r["ability"] == ab]) for ab in ABILITIES
               if any(r["ability"] == ab for r in per_q)}
        out["mean"] = _mean(list(out.values()))
        return out

    report: dict[str, Any] = {
        "suite": os.path.abspath(suite_dir), "tokens": meta["tokens"], "target_tokens": meta["target_tokens"],
        "turns": meta["turns"], "sessions": meta["sessions"], "questions": len(questions),
        "budget_tokens": budget_tokens, "memory": table("memory_recall"), "long_context": table("long_context_recall"),
        "by_wording": {w: {"questions": sum(1 for r in per_q if r["paraphrased"] == (w == "paraphrased")),
                           "memory": _mean([r["memory_recall"] for r in per_q if r["paraphrased"] == (w == "paraphrased")]),
                           "long_context": _mean([r["long_context_recall"] for r in per_q if r["paraphrased"] == (w == "paraphrased")])}
                       for w in ("literal", "paraphrased")},
        "timing": {"ingest_s": round(ingest_s, 2), "context_p50_ms": round(1000 * statistics.median(lat), 2) if lat else 0.0,
                   "context_max_ms": round(1000 * max(lat), 2) if lat else 0.0},
    }
    if reader is not None:
        report["answer_accuracy"] = {"reader": reader.name, "memory": table("memory_correct"),
                                     "long_context": table("long_context_correct")}
    report["per_question"] = per_q
    return report


def write_report(report: dict[str, Any], path: str) -> None:
    """The evaluation report as JSON at `path` (atomically)."""
    from mpa_jax.files import write_json

    write_json(path, report, indent=1, sort_keys=False)
