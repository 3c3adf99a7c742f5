"""The persistent memory store: SQLite (WAL) with FTS5 over interactions and extracted facts.

One file per store. Every ingested turn keeps its session and timestamp; facts (attribute -> value,
with kind fact | preference | instruction) are extracted from user turns by a few phrase patterns or
written explicitly. A fact for the same (subject, attribute) supersedes the older one, which stays as
history. Search is lexical (FTS5 bm25) re-ranked by recency and entity match; `search` abstains
(a confident "nothing known") when the query names an entity the store has never seen or no hit
covers enough of the query's content words.

Crash safety: WAL journal, `synchronous=NORMAL`, every `ingest_many` batch is one transaction, so a
writer killed mid-way leaves the store at its last committed batch (tested by killing a writer).
"""
from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import math
import os
import re
import sqlite3
import threading
from typing import Any, Callable, Iterable, TypeVar

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, session TEXT NOT NULL, ts TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS turns_ts ON turns (ts);
CREATE VIRTUAL TABLE IF NOT EXISTS turns_fts USING fts5 (content, content='turns', content_rowid='id');
CREATE TABLE IF NOT EXISTS vocab (term TEXT PRIMARY KEY, df INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY, subject TEXT NOT NULL, attribute TEXT NOT NULL, value TEXT NOT NULL,
    kind TEXT NOT NULL, ts TEXT NOT NULL, session TEXT NOT NULL, turn_id INTEGER, superseded_by INTEGER);
CREATE INDEX IF NOT EXISTS facts_key ON facts (subject, attribute, ts);
CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5 (text, content='');
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Words that carry no topic: dropped from queries (bm25 over them is slow and uninformative).
STOPWORDS = frozenset("""
a about above after again all am an and any are as at be been before being below between both but by can
could did do does doing done down during each ever few for from further had has have having he her here
hers him his how i if in into is it its itself just me more most my myself no nor not now of off on once
only or other our ours out over own please same she should so some such than that the their them then
there these they this those through to too under until up very was we were what when where which while
who whom why will with would you your yours yourself tell know remind recall did does whats what's ive any
i'm im i've we've let lets thing things currently current today yesterday said say mentioned earlier
""".split())

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'+\-]*")

NOTHING_KNOWN = "NOTHING KNOWN"


def estimate_tokens(text: str) -> int:
    """Token estimate used for budgets and suite sizes: ceil(chars / 4), the usual BPE average for English."""
    return (len(text) + 3) // 4


def content_words(text: str) -> list[str]:
    """Lower-cased content words of `text` in order, without stop words and duplicates."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        w = w.strip("'-")
        if len(w) > 1 and w not in STOPWORDS and w not in out:
            out.append(w)
    return out


def word_set(text: str) -> set[str]:
    """The set of `content_words(text)`, faster (ingest counts document frequencies over every turn)."""
    words = {w.strip("'-") for w in _WORD.findall(text.lower())}
    return {w for w in words - STOPWORDS if len(w) > 1}


def query_entities(text: str) -> list[str]:
    """Capitalised names in a query that do not start a sentence ("Who is Dana Kim?" -> ["Dana Kim"])."""
    ents: list[str] = []
    run: list[str] = []
    sentence_start = True
    for m in re.finditer(r"[A-Za-z][A-Za-z'\-]*|[.!?]", text):
        w = m.group(0)
        if w in ".!?":
            sentence_start = True
            if run:
                ents.append(" ".join(run))
                run = []
            continue
        # Names, not acronyms or units ("KB", "IBAN"): only those anchor a query or make it abstain.
        if w[0].isupper() and not w.isupper() and len(w) > 1 and not sentence_start and w.lower() not in STOPWORDS:
            run.append(w)
        elif run:
            ents.append(" ".join(run))
            run = []
        sentence_start = False
    if run:
        ents.append(" ".join(run))
    return ents


# Fact extraction from a user's own words: (pattern, kind). Group `attr` names the attribute, `value` its value.
_FACT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bmy (?P<attr>[a-z][a-z' ]{1,40}?) is (?:now |actually )?(?P<value>[^.;!?,]{1,80})", re.I), "fact"),
    (re.compile(r"\b(?P<value>[A-Z][\w' ]{1,40}?) is (?:now )?my (?P<attr>[a-z][a-z ]{1,30}?)\b(?: now)?[.;!?]", re.I), "fact"),
    (re.compile(r"\bI(?:'m| am)?(?: really)? (?:prefer|like|love|can't stand|hate|avoid|allergic to|vegetarian|vegan)\b,? ?(?P<value>[^.;!?]{1,80})", re.I), "preference"),
    (re.compile(r"\b(?:from now on|going forward|always|never)\b,? (?P<value>[^.;!?]{1,120})", re.I), "instruction"),
)


# Substrings one of the patterns needs: most turns have none and skip the regexes (plain `in` is cheap).
_FACT_TRIGGERS = ("my ", "prefer", "like", "love", "stand", "hate", "avoid", "allergic", "vegetarian", "vegan",
                  "from now on", "going forward", "always", "never")
_GENERIC = frozenset(("whenever", "ask", "asking", "talk", "comes", "really", "prefer", "like"))


def extract_facts(text: str) -> list[tuple[str, str, str]]:
    """(attribute, value, kind) triples a user turn states about the user; instructions and preferences are
    keyed by their first content words, so a newer instruction on the same topic supersedes the older."""
    out: list[tuple[str, str, str]] = []
    low = text.lower()
    if not any(t in low for t in _FACT_TRIGGERS):
        return out
    for pat, kind in _FACT_PATTERNS:
        for m in pat.finditer(text):
            value = m.group("value").strip()
            if kind == "fact":
                attr = " ".join(content_words(m.group("attr"))) or m.group("attr").strip().lower()
            else:  # keyed by its topic words, so only a newer statement on the same topic supersedes it
                attr = kind + ":" + " ".join([w for w in content_words(value) if w not in _GENERIC][:3])
            if attr and value:
                out.append((attr, value, kind))
    return out


@dataclasses.dataclass
class Hit:
    """One retrieved turn with its scores."""

    turn_id: int
    session: str
    ts: str
    role: str
    content: str
    score: float
    coverage: float  # fraction of the query's content words the turn contains

    def render(self) -> str:
        return f"[{self.ts} session {self.session}] {self.role}: {self.content}"


@dataclasses.dataclass
class Fact:
    """A fact with the value history of its (subject, attribute): `history` is oldest first, without `value`."""

    id: int
    subject: str
    attribute: str
    value: str
    kind: str
    ts: str
    session: str
    turn_id: int | None
    history: list[dict[str, str]] = dataclasses.field(default_factory=list)

    def render(self) -> str:
        s = f"{self.subject} {self.attribute} = {self.value} (since {self.ts})"
        if self.history:
            s += "; earlier: " + ", ".join(f"{h['value']} ({h['ts']})" for h in self.history)
        return s


@dataclasses.dataclass
class SearchResult:
    """Hits best first; `abstain` is the confident "nothing known" signal, with the reason."""

    hits: list[Hit]
    facts: list[Fact]
    abstain: bool
    reason: str = ""


F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """Serialise a public method on the store's lock: one connection, shared by threads (harness episodes)."""
    import functools

    @functools.wraps(fn)
    def wrapper(self: "MemoryStore", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class MemoryStore:
    """A persistent store at `path` (":memory:" for a throwaway one). Thread-safe: public methods take the
    store's lock. Several processes may read; one writes at a time (SQLite's WAL rules)."""

    def __init__(self, path: str, *, recency_weight: float = 0.3, entity_weight: float = 1.0,
                 candidates: int = 64, min_coverage: float = 0.5, rank_limit: int = 500) -> None:
        if path != ":memory:" and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        self.recency_weight = recency_weight
        self.entity_weight = entity_weight
        self.candidates = candidates
        self.min_coverage = min_coverage
        self.rank_limit = rank_limit  # above this many matching turns, candidates are the newest, not bm25's best

    @_locked
    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ writes

    def ingest_turn(self, session: str, ts: str, role: str, content: str, *, extract: bool = True) -> int:
        """Store one conversation turn (and the facts a user turn states); returns the turn id."""
        return self.ingest_many([(session, ts, role, content)], extract=extract)[0]

    @_locked
    def ingest_many(self, turns: Iterable[tuple[str, str, str, str]], *, extract: bool = True,
                    ids: Iterable[int] | None = None) -> list[int]:
        """Store many (session, ts, role, content) turns in one transaction; returns their ids."""
        rows = [(str(s), _check_ts(ts), str(r), str(c)) for s, ts, r, c in turns]
        idl = list(ids) if ids is not None else None
        if idl is not None and len(idl) != len(rows):
            raise ValueError(f"ingest_many: {len(idl)} ids for {len(rows)} turns")
        out: list[int] = []
        cur = self.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            if idl is not None:
                cur.executemany("INSERT INTO turns (id, session, ts, role, content) VALUES (?, ?, ?, ?, ?)",
                                [(i, *r) for i, r in zip(idl, rows)])
                out = idl
            else:
                for r in rows:
                    cur.execute("INSERT INTO turns (session, ts, role, content) VALUES (?, ?, ?, ?)", r)
                    out.append(int(cur.lastrowid))
            cur.executemany("INSERT INTO turns_fts (rowid, content) VALUES (?, ?)", [(i, r[3]) for i, r in zip(out, rows)])
            # Document frequency per content word, kept beside the index: FTS5's own vocabulary table counts
            # by walking whole doclists (about 10 ms a query at 10M tokens).
            df: collections.Counter[str] = collections.Counter()
            for r in rows:
                df.update(word_set(r[3]))
            cur.executemany("INSERT INTO vocab (term, df) VALUES (?, ?) ON CONFLICT(term) DO UPDATE SET df = df + excluded.df",
                            df.items())
            if extract:
                for i, (s, ts, role, content) in zip(out, rows):
                    if role == "user":
                        for attr, value, kind in extract_facts(content):
                            self._write_fact(cur, "user", attr, value, kind, ts, s, i, content)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return out

    @_locked
    def write_fact(self, attribute: str, value: str, *, subject: str = "user", kind: str = "fact",
                   ts: str | None = None, session: str = "", turn_id: int | None = None) -> int:
        """Record a fact; an older fact of the same (subject, attribute) is superseded and kept as history."""
        if kind not in ("fact", "preference", "instruction", "event"):
            raise ValueError(f"fact kind must be fact, preference, instruction or event, got {kind!r}")
        ts = _check_ts(ts or dt.datetime.now().strftime("%Y-%m-%dT%H:%M"))
        cur = self.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            fid = self._write_fact(cur, subject, attribute.strip().lower(), value.strip(), kind, ts, session, turn_id)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return fid

    def _write_fact(self, cur: sqlite3.Cursor, subject: str, attr: str, value: str, kind: str, ts: str,
                    session: str, turn_id: int | None, source: str = "") -> int:
        cur.execute("INSERT INTO facts (subject, attribute, value, kind, ts, session, turn_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (subject, attr, value, kind, ts, session, turn_id))
        fid = int(cur.lastrowid)
        # Newer (by timestamp, then id) wins: the current row is the one nothing supersedes.
        cur.execute("UPDATE facts SET superseded_by = ? WHERE subject = ? AND attribute = ? AND id != ? "
                    "AND superseded_by IS NULL AND (ts < ? OR (ts = ? AND id < ?))",
                    (fid, subject, attr, fid, ts, ts, fid))
        newer = cur.execute("SELECT id FROM facts WHERE subject = ? AND attribute = ? AND id != ? AND (ts > ? OR (ts = ? AND id > ?)) "
                            "ORDER BY ts DESC, id DESC LIMIT 1", (subject, attr, fid, ts, ts, fid)).fetchone()
        if newer:  # an out-of-order write of an older fact goes straight into history
            cur.execute("UPDATE facts SET superseded_by = ? WHERE id = ?", (newer[0], fid))
        cur.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (fid, f"{subject} {attr} {value} {source[:300]}"))
        return fid

    # ------------------------------------------------------------------------------------ reads

    @_locked
    def count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM turns").fetchone()[0])

    @_locked
    def turn(self, turn_id: int) -> Hit | None:
        r = self.conn.execute("SELECT id, session, ts, role, content FROM turns WHERE id = ?", (turn_id,)).fetchone()
        return Hit(*r, score=0.0, coverage=0.0) if r else None

    @_locked
    def recent(self, budget_tokens: int) -> list[Hit]:
        """The most recent turns whose rendered lines fit `budget_tokens`, oldest first (the long-context view)."""
        out: list[Hit] = []
        used = 0
        for r in self.conn.execute("SELECT id, session, ts, role, content FROM turns ORDER BY ts DESC, id DESC"):
            h = Hit(*r, score=0.0, coverage=0.0)
            cost = estimate_tokens(h.render()) + 1
            if used + cost > budget_tokens:
                break
            used += cost
            out.append(h)
        return out[::-1]

    @_locked
    def between(self, start: str, end: str, query: str = "", limit: int = 50) -> list[Hit]:
        """Turns with start <= ts < end, oldest first; with a query, only turns matching its content words."""
        start, end = _check_ts(start), _check_ts(end)
        if not query.strip():
            rows = self.conn.execute("SELECT id, session, ts, role, content FROM turns WHERE ts >= ? AND ts < ? "
                                     "ORDER BY ts, id LIMIT ?", (start, end, limit)).fetchall()
            return [Hit(*r, score=0.0, coverage=0.0) for r in rows]
        hits = self.search(query, limit=limit, since=start, until=end).hits
        return sorted(hits, key=lambda h: (h.ts, h.turn_id))

    @_locked
    def facts(self, attribute: str | None = None, *, subject: str | None = None, kind: str | None = None,
              query: str = "", limit: int = 20) -> list[Fact]:
        """Current facts (each with its history), filtered by attribute / subject / kind / a lexical query."""
        where, args = ["superseded_by IS NULL"], []
        if attribute is not None:
            where.append("attribute = ?")
            args.append(attribute.strip().lower())
        if subject is not None:
            where.append("subject = ?")
            args.append(subject)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        order: dict[int, int] = {}
        if query.strip():
            match = _match_expr(content_words(query), "OR")
            if not match:
                return []
            ranked = self.conn.execute(f"SELECT rowid FROM facts_fts WHERE facts_fts MATCH ? ORDER BY rank LIMIT {int(limit) * 8}",
                                       (match,)).fetchall()
            order = {r[0]: i for i, r in enumerate(ranked)}
            if not order:
                return []
            where.append(f"id IN ({','.join(str(k) for k in order)})")
        rows = self.conn.execute(f"SELECT id, subject, attribute, value, kind, ts, session, turn_id FROM facts WHERE "
                                 f"{' AND '.join(where)} ORDER BY ts DESC, id DESC", args).fetchall()
        if order:  # best lexical match first
            rows.sort(key=lambda r: order[r[0]])
        rows = rows[:limit]
        out = []
        for r in rows:
            f = Fact(*r)
            hist = self.conn.execute("SELECT value, ts FROM facts WHERE subject = ? AND attribute = ? AND id != ? "
                                     "AND (ts < ? OR (ts = ? AND id < ?)) ORDER BY ts, id",
                                     (f.subject, f.attribute, f.id, f.ts, f.ts, f.id)).fetchall()
            f.history = [{"value": v, "ts": t} for v, t in hist]
            out.append(f)
        return out

    @_locked
    def known_term(self, term: str) -> bool:
        """Whether any turn contains every word of `term` as a phrase."""
        if not _WORD.findall(term):
            return False
        phrase = _phrase(term)
        return self.conn.execute("SELECT 1 FROM turns_fts WHERE turns_fts MATCH ? LIMIT 1", (phrase,)).fetchone() is not None

    @_locked
    def search(self, query: str, *, limit: int = 10, since: str | None = None, until: str | None = None) -> SearchResult:
        """Best turns for `query`: bm25 candidates (all content words, else any), re-ranked by
        bm25 + recency + entity match; plus matching current facts. Abstains with a reason when the query
        names an unknown entity or no hit covers `min_coverage` of the query's content words."""
        since = _check_ts(since) if since is not None else None
        until = _check_ts(until) if until is not None else None
        words = content_words(query)
        ents = query_entities(query)
        unknown = [e for e in ents if not self.known_term(e)]
        facts = self.facts(query=query, limit=5) if words else []
        if not words:
            return SearchResult([], [], True, "the query has no content words")
        if unknown:
            return SearchResult([], [], True, f"nothing is known about {unknown[0]!r}")
        df = self._doc_freq(words)
        words = [w for w in words if df[w] > 0]
        if not words:
            return SearchResult([], facts, not facts, "no stored turn contains any word of the query")
        # Candidates: AND over the rarest words, then fewer of them, down to the rarest alone, until enough.
        by_rarity = sorted(words, key=lambda w: df[w])
        rows: list[tuple] = []
        seen: set[int] = set()
        # Turns naming the query's entities come first: an entity anchors everything said about it.
        ent_df = self._doc_freq([w for e in ents for w in content_words(e)])
        exprs = [(_phrase(e), min([ent_df.get(w, 0) for w in content_words(e)] or [0])) for e in ents]
        # At most the three rarest words: a common word's doclist costs more to intersect than it adds
        # (the re-ranker scores coverage of all the words anyway).
        exprs += [(_match_expr(by_rarity[:k], "AND"), df[by_rarity[0]]) for k in range(min(3, len(by_rarity)), 0, -1)]
        for expr, upper in exprs:
            # bm25-ranking a huge match set costs tens of ms; past `rank_limit` matches take the newest instead
            # (the re-ranker weighs coverage and recency anyway).
            for r in self._candidates(expr, since, until, ranked=upper <= self.rank_limit):
                if r[0] not in seen:
                    seen.add(r[0])
                    rows.append(r)
            if len(rows) >= self.candidates:
                break
        # Still short (a small store, or words that never meet): any of the words, when that is cheap.
        if len(rows) < self.candidates and len(words) > 1 and sum(df.values()) <= 20 * self.rank_limit:
            for r in self._candidates(_match_expr(words, "OR"), since, until, ranked=sum(df.values()) <= self.rank_limit):
                if r[0] not in seen:
                    seen.add(r[0])
                    rows.append(r)
        total = max(1, self.count_cached())
        idf = {w: math.log(1.0 + total / df[w]) for w in words}
        if not rows:
            return SearchResult([], facts, not facts, "no stored turn matches the query")
        newest = self.conn.execute("SELECT max(ts) FROM turns").fetchone()[0]
        hits = [self._score(r, words, idf, ents, newest) for r in rows]
        hits.sort(key=lambda h: -h.score)
        hits = hits[:limit]
        best = max(h.coverage for h in hits)
        # Named entities that the store knows anchor the query; without any, demand enough word coverage.
        if not ents and best < self.min_coverage and not facts:
            return SearchResult(hits, facts, True, f"the best match covers {best:.0%} of the query")
        return SearchResult(hits, facts, False)

    def _doc_freq(self, words: list[str]) -> dict[str, int]:
        """Turns containing each content word (the `vocab` table kept at ingest)."""
        out = dict.fromkeys(words, 0)
        if words:
            q = f"SELECT term, df FROM vocab WHERE term IN ({', '.join('?' * len(words))})"
            out.update(self.conn.execute(q, words).fetchall())
        return out

    def count_cached(self) -> int:
        """Turn count, refreshed at most once per thousand calls (search needs it only for idf)."""
        self._count_calls = getattr(self, "_count_calls", 0) + 1
        if self._count_calls % 1000 == 1 or not hasattr(self, "_count"):
            self._count = self.count()
        return self._count

    def _candidates(self, match: str, since: str | None, until: str | None, ranked: bool = True) -> list[tuple]:
        """Up to `candidates` turns matching the FTS expression: best bm25 first, or (ranked=False) newest
        first (turn ids follow arrival order)."""
        if not match:
            return []
        order = "rank" if ranked else "rowid DESC"
        where, args = "", [match]
        if since or until:  # filter inside the FTS scan so the range is not starved by the candidate limit
            where = " AND rowid IN (SELECT id FROM turns WHERE ts >= ? AND ts < ?)"
            args += [since or "", until or "\uffff"]
        sql = ("SELECT t.id, t.session, t.ts, t.role, t.content, f.rank FROM "
               f"(SELECT rowid, rank FROM turns_fts WHERE turns_fts MATCH ?{where} ORDER BY {order} LIMIT {int(self.candidates)}) f "
               "JOIN turns t ON t.id = f.rowid")
        return self.conn.execute(sql, args).fetchall()

    def _score(self, row: tuple, words: list[str], idf: dict[str, float], ents: list[str], newest: str) -> Hit:
        tid, session, ts, role, content, rank = row
        low = content.lower()
        have = set(content_words(content))
        # Coverage weighted by idf: the query's rare words matter more than its common ones.
        coverage = sum(idf[w] for w in words if w in have or w in low) / sum(idf.values())
        ent = sum(1 for e in ents if e.lower() in low)
        age_days = max(0.0, _days(ts, newest))
        recency = 1.0 / (1.0 + age_days / 30.0)
        # bm25 rank is negative (smaller is better); squash to (0, 1) so the weights are comparable.
        lexical = 1.0 - math.exp(rank / 4.0)
        score = lexical + 2.0 * coverage + self.recency_weight * recency + self.entity_weight * ent
        return Hit(tid, session, ts, role, content, score=score, coverage=coverage)


def _phrase(term: str) -> str:
    """An FTS5 phrase query for `term` (its words in order)."""
    return '"' + " ".join(w.replace('"', "") for w in _WORD.findall(term.lower())) + '"'


def _match_expr(words: list[str], op: str) -> str:
    terms = ['"' + w.replace('"', "") + '"' for w in words if w.replace('"', "")]
    return f" {op} ".join(terms)


def _check_ts(ts: Any) -> str:
    """Timestamps are ISO strings ("YYYY-MM-DD" or "YYYY-MM-DDTHH:MM[:SS]"); anything else is a ValueError."""
    if not isinstance(ts, str):
        raise ValueError(f"timestamp must be an ISO date string, got {type(ts).__name__}")
    try:
        dt.datetime.fromisoformat(ts)
    except ValueError:
        raise ValueError(f"timestamp {ts!r} is not an ISO date (YYYY-MM-DD[THH:MM])") from None
    return ts


def _days(a: str, b: str) -> float:
    return (dt.datetime.fromisoformat(b) - dt.datetime.fromisoformat(a)).total_seconds() / 86400.0
