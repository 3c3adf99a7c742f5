"""A small, strict JSON-Schema subset compiled to fast validator closures.

Tools declare their parameters as JSON Schema objects (`additionalProperties: false`). Validation runs on
every call on the hot path, so each schema is compiled once into nested closures; a failure raises
`SchemaError` whose message names the offending argument.

Supported: type object/string/integer/number/boolean/array, properties, required, additionalProperties
(false only), enum, minLength/maxLength, pattern, minimum/maximum, items, minItems/maxItems.
"""
from __future__ import annotations

import re
from typing import Any, Callable

Validator = Callable[[Any, str], None]


class SchemaError(ValueError):
    """Arguments do not match a tool's schema; the message names the argument."""


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def compile_schema(schema: dict[str, Any]) -> Callable[[Any], None]:
    """Compile `schema` into `validate(value)` raising SchemaError; unknown schema keywords are an error."""
    inner = _compile(schema, "arguments")

    def validate(value: Any) -> None:
        inner(value, "arguments")

    return validate


_KNOWN = {
    "type", "properties", "required", "additionalProperties", "enum", "minLength", "maxLength", "pattern",
    "minimum", "maximum", "items", "minItems", "maxItems", "description", "format", "default", "title",
}


def _compile(schema: dict[str, Any], where: str) -> Validator:
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema at {where}: unsupported keyword {sorted(unknown)[0]!r}")
    t = schema.get("type")
    checks: list[Validator] = []
    if t == "object":
        props = {k: _compile(v, f"{where}.{k}") for k, v in schema.get("properties", {}).items()}
        required = tuple(schema.get("required", ()))
        closed = schema.get("additionalProperties", True) is False

        def check_object(v: Any, path: str) -> None:
            if not isinstance(v, dict):
                raise SchemaError(f"{path} must be an object, got {_type_name(v)}")
            for r in required:
                if r not in v:
                    raise SchemaError(f"missing required argument {r!r}")
            for k, item in v.items():
                sub = props.get(k)
                if sub is None:
                    if closed:
                        raise SchemaError(f"unexpected argument {k!r}")
                    continue
                sub(item, k)

        return check_object
    if t == "string":
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        pat = re.compile(schema["pattern"]) if "pattern" in schema else None

        def check_string(v: Any, path: str) -> None:
            if not isinstance(v, str):
                raise SchemaError(f"argument {path!r} must be a string, got {_type_name(v)}")
            if lo is not None and len(v) < lo:
                raise SchemaError(f"argument {path!r} must have at least {lo} characters")
            if hi is not None and len(v) > hi:
                raise SchemaError(f"argument {path!r} must have at most {hi} characters")
            if pat is not None and not pat.fullmatch(v):
                raise SchemaError(f"argument {path!r} has the wrong format (expected {pat.pattern})")

        checks.append(check_string)
    elif t in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        want_int = t == "integer"

        def check_number(v: Any, path: str) -> None:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SchemaError(f"argument {path!r} must be {'an integer' if want_int else 'a number'}, got {_type_name(v)}")
            if want_int and not isinstance(v, int):
                raise SchemaError(f"argument {path!r} must be an integer, got {_type_name(v)}")
            if isinstance(v, float) and v != v:
                raise SchemaError(f"argument {path!r} must be a finite number")
            if lo is not None and v < lo:
                raise SchemaError(f"argument {path!r} must be >= {lo}")
            if hi is not None and v > hi:
                raise SchemaError(f"argument {path!r} must be <= {hi}")

        checks.append(check_number)
    elif t == "boolean":

        def check_bool(v: Any, path: str) -> None:
            if not isinstance(v, bool):
                raise SchemaError(f"argument {path!r} must be a boolean, got {_type_name(v)}")

        checks.append(check_bool)
    elif t == "array":
        item = _compile(schema.get("items", {}), f"{where}[]")
        lo, hi = schema.get("minItems"), schema.get("maxItems")

        def check_array(v: Any, path: str) -> None:
            if not isinstance(v, list):
                raise SchemaError(f"argument {path!r} must be an array, got {_type_name(v)}")
            if lo is not None and len(v) < lo:
                raise SchemaError(f"argument {path!r} must have at least {lo} items")
            if hi is not None and len(v) > hi:
                raise SchemaError(f"argument {path!r} must have at most {hi} items")
            for i, x in enumerate(v):
                item(x, f"{path}[{i}]")

        checks.append(check_array)
    elif t is not None:
        raise ValueError(f"schema at {where}: unsupported type {t!r}")
    if "enum" in schema:
        allowed = tuple(schema["enum"])

        def check_enum(v: Any, path: str) -> None:
            if v not in allowed or type(v) is not type(allowed[allowed.index(v)]):
                raise SchemaError(f"argument {path!r} must be one of {list(allowed)}")

        checks.append(check_enum)
    if len(checks) == 1:
        return checks[0]

    def check_all(v: Any, path: str) -> None:
        for c in checks:
            c(v, path)

    return check_all
