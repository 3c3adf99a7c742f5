"""Entity grounding: names in a tool call's arguments must come from the conversation.

A small planner copies the first word of a name from the request and invents the rest ("text it to Hana
Costa" -> search_contacts(query="Hana Walsh")): the call is valid, the search comes back empty and the
planner guesses an id. Grounding catches exactly that: a run of capitalised words in an argument that
appears nowhere in what the episode has seen (system prompt, conversation, tool results) is replaced by
the one run of the request with the same length and the same first word. Anything ambiguous (no such
run, or more than one) is left alone, and so is every value that does appear somewhere.

Whether (and which tool arguments) are grounded is not decided here: a harness version lists rules
{tool, arg} in `grounding.json` ("*" = any), mined from failure traces by `harness.evolution.mine` and
released after review.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

# A capitalised word (names, titles, places): "Hana", "O'Brien", "Jean-Luc"; runs are two or more of them.
_WORD = r"[A-Z][A-Za-z'’\-]*"
_RUN = re.compile(rf"\b{_WORD}(?:\s+{_WORD})+")


def name_runs(text: str) -> list[str]:
    """Maximal runs of two or more capitalised words in `text`."""
    return [m.group(0) for m in _RUN.finditer(text or "")]


def _candidates(run: str, request_runs: Iterable[str]) -> set[str]:
    words = run.split()
    out = set()
    for r in request_runs:
        rw = r.split()
        # a request run may be longer ("Send Omar Silva"): every window of the same length counts
        for i in range(len(rw) - len(words) + 1):
            window = rw[i:i + len(words)]
            if window[0] == words[0] and window != words:
                out.add(" ".join(window))
    return out


def ground_value(value: str, seen: str, request: str) -> tuple[str, list[tuple[str, str]]]:
    """`value` with every ungrounded name run replaced by its unique request run; and the replacements.

    `seen` is everything the episode has shown so far (a run found in it is grounded); `request` is the
    user's side of the conversation, where replacements come from. A run that starts with a capitalised
    non-name ("Text Hana Walsh") is judged by its suffixes too, longest first."""
    replaced: list[tuple[str, str]] = []
    request_runs = name_runs(request)
    out = value
    for run in name_runs(value):
        words = run.split()
        for start in range(len(words) - 1):
            sub = " ".join(words[start:])
            if sub in seen:
                break
            cands = _candidates(sub, request_runs)
            if len(cands) > 1:
                break  # ambiguous: leave it
            if cands:
                new = next(iter(cands))
                out = out.replace(sub, new)
                replaced.append((sub, new))
                break
    return out, replaced


def ground_arguments(args: Any, tool: str, rules: list[dict[str, Any]], seen: str, request: str) -> tuple[Any, list[str]]:
    """Apply a version's grounding rules ({tool, arg}; "*" = any tool, any argument) to one call's arguments.
    Returns (arguments, human-readable changes); arguments that are not a dict are returned as they are."""
    if not isinstance(args, dict) or not rules:
        return args, []
    keys = {str(r.get("arg")) for r in rules if r.get("tool") in (tool, "*")}
    if "*" in keys:
        keys = set(args)
    out, changes = dict(args), []
    for key in sorted(keys):
        value = out.get(key)
        if not isinstance(value, str):
            continue
        new, replaced = ground_value(value, seen, request)
        if replaced:
            out[key] = new
            changes.append(f"{key}: {value!r} -> {new!r} (grounded in the request)")
    return out, changes


__all__ = ["name_runs", "ground_value", "ground_arguments"]
