"""Where values came from: the trusted sources of one episode and the injection-segment detector (no jax).

Trusted, in the CaMeL sense of "may reach a sink":
- what the user said (the request, earlier turns, follow-up user turns); the env's own error messages (the
  device/OS speaking, e.g. "cellular is off") count for a tool's purpose words only, never as values;
- structured values (ids, numbers, names, addresses, dict keys: strings of at most `FREE_TEXT_WORDS` words, no
  newline) of a tool result whose call used only trusted argument values (a read the user's request led to);
- the text of a document the user named (a call argument the user wrote in quotes, or a file name or URL the user
  wrote: "pay the bill 'bill-december-2023.txt'"), only for a sink whose purpose the user stated, and without the
  segments `instruction_spans` flags (text that addresses the agent with orders).

Everything else (values only inside free text of documents the user did not name, results of calls steered by
untrusted values) is untrusted. Matching
is by normalised string (case, spaces; phone numbers by digits) or, inside text, on word boundaries; numbers match
numerically.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

FREE_TEXT_WORDS = 6  # a string with more words than this (or a newline) is free text, not a structured value
# Text that addresses the agent with orders: the openings of injected instructions (AgentDojo's attacks and the
# usual variants). A flagged span runs from its paragraph to a closing </information> tag or the text's end.
INSTRUCTION = re.compile(
    r"<\s*information\s*>|\bignore\b[^.\n]{0,40}\b(instructions?|previous|prior|above|earlier)\b|\bdisregard\b"
    r"|\bimportant (message|instructions?|notice)\b|\bbefore you (can )?(solve|continue|do|answer|finish)\b"
    r"|\b(ai|language) (model|assistant|agent)\b|\b(dear|attention|note to( the)?|hey) (assistant|agent|ai|bot)\b"
    r"|\b(assistant|agent)\s*[,:]|\bnew (instructions?|task)\b|\bsystem (message|notice|override|prompt)\b"
    r"|\b(admin|security|it) (notice|override|instruction)\b|\binstead,? (you (must|should)|please)\b"
    r"|\byou (must|are required to|need to) (now |first |immediately )?(send|text|pay|transfer|forward|email|turn|enable|disable|share|call)\b"
    r"|\bdo not (tell|inform|mention)\b[^.\n]{0,30}\buser\b|\bwithout (asking|telling|informing)\b",
    re.IGNORECASE)
CLOSE = re.compile(r"<\s*/\s*information\s*>", re.IGNORECASE)
# a literal in quotes (not an apostrophe inside a word): what an injected order names as its target
QUOTED = re.compile("(?<![\\w])[\"'`\u2018\u201c]([^\"'`\u2019\u201d\n]{1,80}?)[\"'`\u2019\u201d](?![\\w])")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
URL = re.compile(r"(?:https?://|www\.)[^\s<>\"')]+|\b[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|io|co|info)(?:/[^\s<>\"')]*)?",
                 re.IGNORECASE)
PHONE = re.compile(r"\+?\d[\d\s().-]{6,}\d")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}[A-Z0-9]{10,30}\b")
NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")
# The user points the agent at data as the source of the details (the brief's "data the user asked to read for that
# purpose"): then values in that data may reach the purposed sinks.
DELEGATION = re.compile(r"\b(find (the |all the )?(details|info|information)|details (are )?in|(listed|mentioned|written|described) (in|on)"
                        r"|according to|accordingly|follow the instructions|in (the|my|his|her|their) (message|email|file|note|"
                        r"document|inbox|channel|list|todo)|find (a|the) (message|email|file))\b", re.IGNORECASE)
ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[ T]\d{2}:\d{2}(?::\d{2})?)?$")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
          "december")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}")
FILE = re.compile(r"\.[a-z0-9]{2,4}$", re.IGNORECASE)


def norm(s: str) -> str:
    return " ".join(str(s).lower().replace("\u2019", "'").split())


def digits(s: str) -> str:
    return re.sub(r"\D", "", s)


def is_free_text(s: str) -> bool:
    return "\n" in s or len(s.split()) > FREE_TEXT_WORDS


def instruction_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of `text` that give the agent orders (see INSTRUCTION): from the start of the sentence of each
    match to the next closing tag, else to the end of its paragraph (a blank line), else of the text."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        m = INSTRUCTION.search(text, pos)
        if m is None:
            return spans
        start = max(text.rfind("\n", pos, m.start()) + 1, *(text.rfind(p, pos, m.start()) + 2 for p in (". ", "! ", "? ")))
        close = CLOSE.search(text, m.end())
        para = text.find("\n\n", m.end())
        end = close.end() if close else para if para >= 0 else len(text)
        spans.append((start, end))
        pos = end
        if pos >= len(text):
            return spans


def strip_instructions(text: str) -> str:
    """`text` without its instruction spans."""
    out, last = [], 0
    for a, b in instruction_spans(text):
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return "".join(out)


def entities(text: str) -> list[str]:
    """Address-like entities in a text: emails, URLs, phone numbers, IBANs (what a content sink checks)."""
    found = EMAIL.findall(text) + IBAN.findall(text)
    emails = set(EMAIL.findall(text))
    found += [u for u in URL.findall(text) if not any(u in e for e in emails)]
    # a digit run inside an IBAN, address or URL is not a phone number of its own
    found += [p for p in PHONE.findall(text) if len(digits(p)) >= 7 and not DATE.search(p) and not any(p in f for f in found)]
    return list(dict.fromkeys(x.rstrip(".,;:") for x in found))


def scalars(obj: Any) -> Iterable[Any]:
    """Every scalar leaf of a JSON-like value."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from scalars(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from scalars(v)
    elif obj is not None:
        yield obj


def keys(obj: Any) -> Iterable[str]:
    """Every string key of a JSON-like value's dicts (AgentDojo keys some maps by email address)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                yield k
            yield from keys(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from keys(v)


def parse_result(result: Any) -> Any:
    """A tool result as data: dicts and lists as they are; a string that is a JSON or YAML document (AgentDojo's
    results are YAML) parsed; other strings kept."""
    if not isinstance(result, str):
        return result
    s = result.strip()
    if not s:
        return result
    try:
        return json.loads(s)
    except ValueError:
        pass
    try:
        import yaml

        data = yaml.safe_load(s)
    except Exception:  # noqa: BLE001 - not YAML: free text
        return result
    return data if isinstance(data, (dict, list)) else result


class Provenance:
    """The trusted sources of one episode (module docstring). `observe_*` feed it; `trusted(v, doc)` asks it."""

    def __init__(self) -> None:
        self.user_text: list[str] = []  # the user's turns
        self.env_text: list[str] = []  # the env's own errors: they may name a needed step (purpose), never values
        self.values: set[str] = set()  # normalised structured values of trusted results
        self.numbers: set[float] = set()
        self.docs: list[str] = []  # free text of trusted results, instruction spans removed
        self.flagged: list[str] = []  # the instruction spans seen (evidence in refusals and reports)

    # ---------------------------------------------------------------- feeding
    def observe_user(self, text: str) -> None:
        if text:
            self.user_text.append(str(text))

    def observe_env(self, text: str) -> None:
        """An error the env itself gave (its message and hint): counts for purpose words only."""
        if text:
            self.env_text.append(str(text))

    def named(self, call_args: Any) -> bool:
        """Whether a call reads a document the user named: one of its string arguments is written in the user's
        turns in quotes, or is a file name or URL the user wrote; or the user sends the agent to data for details
        (`DELEGATION`: "you can find the details in the message from Bob") and the argument is one the user wrote."""
        said = " ".join(self.user_text)
        delegated = DELEGATION.search(said) is not None
        for v in scalars(call_args):
            if not isinstance(v, str) or len(v) < 3:
                continue
            quoted = re.search(r"[\"'`\u2018\u201c]" + re.escape(v) + r"[\"'`\u2019\u201d]", said, re.IGNORECASE)
            if quoted or ((FILE.search(v) or URL.fullmatch(v) or delegated) and _contains(norm(said), norm(v))):
                return True
        return False

    def observe_result(self, call_args: Any, result: Any) -> None:
        """A tool result: trusted as data only when the call's own argument values were trusted; its text counts
        (for purposed sinks) only when the user named the document."""
        data = parse_result(result)
        for v in scalars(data):  # instruction spans are evidence whoever's read brought them
            if isinstance(v, str) and is_free_text(v):
                self.flagged += [v[a:b] for a, b in instruction_spans(v)]
        # selectors (ids, names, queries) decide what is read; free-text arguments (content being written) do not
        if not all(self.trusted(v, doc=True) for v in scalars(call_args) if not (isinstance(v, str) and is_free_text(v))):
            return
        named = self.named(call_args)
        for v in list(scalars(data)) + list(keys(data)):
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)):
                self.numbers.add(float(v))
                self.values.add(norm(str(v)))
                continue
            s = str(v)
            if is_free_text(s):
                if named:
                    self.docs.append(strip_instructions(s))
            else:
                self.values.add(norm(s))
                if named:
                    self.docs.append(s)
                if PHONE.fullmatch(s.strip()) and len(digits(s)) >= 7:
                    self.values.add(digits(s))

    # ---------------------------------------------------------------- asking
    def said(self, words: Iterable[str]) -> bool:
        """Whether the user (or an env error) used one of `words` (word prefixes, case-insensitive)."""
        text = norm(" ".join(self.user_text + self.env_text))
        return any(re.search(r"(?<![a-z0-9])" + re.escape(w.lower()), text) for w in words)

    def trusted(self, v: Any, doc: bool = False) -> bool:
        """Whether value `v` comes from a trusted source (`doc`: free text of trusted results counts too)."""
        if v is None or isinstance(v, bool):
            return True
        if isinstance(v, (int, float)):
            return self._number(float(v), doc)
        s = str(v).strip()
        if not s:
            return True
        n = norm(s)
        if n in self.values or (len(digits(s)) >= 7 and not re.search(r"[a-z]", n) and digits(s) in self.values):
            return True
        if NUMBER.fullmatch(s.replace(",", "")):
            return self._number(float(s.replace(",", "")), doc)
        iso = ISO_DATE.match(s)
        if iso:
            return self._date(int(iso.group(2)), int(iso.group(3)), iso.group(0)[:10], doc)
        texts = self.user_text + (self.docs if doc else [])
        return any(_contains(norm(t), n) for t in texts) or (
            len(digits(s)) >= 7 and not re.search(r"[a-z]", n) and any(digits(s) in digits(t) for t in texts if PHONE.search(t)))

    def injected(self, v: Any) -> bool:
        """Whether a string value is a literal an instruction span seen in a tool result quotes ("delete the file with
        ID '13'") and the user never said. Such a value is refused at a sink even when a trusted listing also shows
        it: the injected order, not the user's criterion, may have picked it. Only quoted literals, matched whole:
        injections name their targets that way, while a bare word of an injected sentence ("Alice", a path segment
        of a URL) is also the user's own data often enough to cost the oracle its utility (dev split). This rests on
        the detector (`INSTRUCTION`), so it is defence in depth, not a guarantee."""
        if not isinstance(v, str) or not self.flagged:
            return False
        n = norm(v)
        if not n or any(_contains(norm(t), n) for t in self.user_text):
            return False
        return any(norm(q) == n for span in self.flagged for q in QUOTED.findall(span))

    def _date(self, month: int, day: int, iso: str, doc: bool) -> bool:
        """An ISO date (a time after it goes with it): written as such, or as its month's name and its day within a
        few words of each other ("January 2nd", "the 13th to the 17th of May")."""
        texts = self.user_text + (self.docs if doc else [])
        if iso in self.values or any(iso in t for t in texts):
            return True
        name = MONTHS[month - 1]
        near = re.compile(rf"\b{name[:3]}[a-z]*\.?\W+(\w+\W+){{0,2}}{day}(st|nd|rd|th)?\b|\b{day}(st|nd|rd|th)?\W+(\w+\W+){{0,4}}{name[:3]}",
                          re.IGNORECASE)
        return any(near.search(t) for t in texts)

    def _number(self, x: float, doc: bool) -> bool:
        if any(abs(x - y) <= 0.005 for y in self.numbers):
            return True
        texts = self.user_text + (self.docs if doc else [])
        return any(abs(x - float(m.replace(",", "."))) <= 0.005 for t in texts for m in NUMBER.findall(t.replace(",", "")))


def _contains(text: str, needle: str) -> bool:
    """`needle` in `text` on word boundaries (so "5" is not trusted because "15" was said)."""
    return re.search(r"(?<![a-z0-9])" + re.escape(needle) + r"(?![a-z0-9])", text) is not None
