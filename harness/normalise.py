"""Argument normalisation against a tool's JSON schema, before the call reaches the tool.

Two kinds, both recorded in the trace as `changes`:
- schema normalisers (always safe, they never change what was meant): trim surrounding whitespace,
  numbers written as strings ("3" -> 3 for an integer field), "true"/"false" for booleans, an enum
  value in the wrong case ("Friend" -> "friend"), a JSON object passed as a string;
- approved rewrites from a harness version: {tool, arg, from, to} learned from failure traces
  (e.g. a unit the converter refuses, rewritten to the spelling it accepts). Never invented here.
"""
from __future__ import annotations

import json
from typing import Any


def normalise_arguments(args: Any, schema: dict[str, Any], rewrites: list[dict[str, Any]] | None = None,
                        tool: str = "") -> tuple[Any, list[str]]:
    """Return (normalised args, list of human-readable changes). Non-dict args are returned unchanged
    unless they are a JSON object string."""
    changes: list[str] = []
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            return args, changes
        if not isinstance(decoded, dict):
            return args, changes
        args = decoded
        changes.append("decoded arguments given as a JSON string")
    if not isinstance(args, dict):
        return args, changes
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    out = dict(args)
    for key, value in list(out.items()):
        prop = props.get(key)
        if not isinstance(prop, dict):
            continue
        new = _coerce(value, prop)
        if new is not value and new != value:
            changes.append(f"{key}: {value!r} -> {new!r}")
            out[key] = new
    for rule in rewrites or ():
        if rule.get("tool") not in (tool, "*"):
            continue
        key = rule.get("arg")
        if key in out and isinstance(out[key], str) and out[key].strip().lower() == str(rule.get("from", "")).strip().lower():
            changes.append(f"{key}: {out[key]!r} -> {rule['to']!r} (approved rewrite)")
            out[key] = rule["to"]
    return out, changes


def _coerce(value: Any, prop: dict[str, Any]) -> Any:
    typ = prop.get("type")
    if isinstance(value, str):
        stripped = value.strip()
        if typ == "integer" and _is_int(stripped):
            return int(stripped)
        if typ == "number" and _is_number(stripped):
            return float(stripped) if any(c in stripped for c in ".eE") else int(stripped)
        if typ == "boolean" and stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if typ == "string":
            enum = prop.get("enum")
            if enum and stripped not in enum:
                match = [e for e in enum if isinstance(e, str) and e.lower() == stripped.lower()]
                if len(match) == 1:
                    return match[0]
            if stripped != value and stripped:
                return stripped
    if typ == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _is_int(s: str) -> bool:
    return s.lstrip("+-").isdigit() and len(s) < 19


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return s.lower() not in ("nan", "inf", "-inf", "+inf", "infinity")


def schema_hint(schema: dict[str, Any]) -> str:
    """A one-line summary of a parameters schema for error hints: required and optional fields with types."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    req = set(schema.get("required", [])) if isinstance(schema, dict) else set()

    def fmt(name: str) -> str:
        p = props[name]
        t = p.get("type", "any")
        if p.get("enum"):
            t = "|".join(map(str, p["enum"]))
        return f"{name}: {t}"

    required = [fmt(n) for n in props if n in req]
    optional = [fmt(n) for n in props if n not in req]
    parts = []
    if required:
        parts.append("required " + ", ".join(required))
    if optional:
        parts.append("optional " + ", ".join(optional))
    return "; ".join(parts) or "no arguments"
