"""Converter and calculator apps: units, arithmetic and currencies.

`convert`, `evaluate` and `fx` are also what task generators use to compute expected answers.
"""
from __future__ import annotations

import ast
import operator
from typing import Any

from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import NETWORK, ToolError, handler
from mpa_jax.envs.world import World


UNITS: dict[str, tuple[str, float]] = {
    # unit -> (dimension, factor to the SI base); temperatures handled apart
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01), "mm": ("length", 0.001),
    "mi": ("length", 1609.344), "ft": ("length", 0.3048), "in": ("length", 0.0254), "yd": ("length", 0.9144),
    "meters": ("length", 1.0), "kilometers": ("length", 1000.0), "miles": ("length", 1609.344), "feet": ("length", 0.3048),
    "inches": ("length", 0.0254),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "lb": ("mass", 0.45359237), "oz": ("mass", 0.028349523125),
    "kilograms": ("mass", 1.0), "grams": ("mass", 0.001), "pounds": ("mass", 0.45359237), "ounces": ("mass", 0.028349523125),
    "l": ("volume", 1.0), "ml": ("volume", 0.001), "gal": ("volume", 3.785411784), "cup": ("volume", 0.2365882365),
    "liters": ("volume", 1.0), "gallons": ("volume", 3.785411784),
    "kmh": ("speed", 1 / 3.6), "mph": ("speed", 0.44704),
    "C": ("temperature", 0.0), "F": ("temperature", 0.0), "K": ("temperature", 0.0),
    "celsius": ("temperature", 0.0), "fahrenheit": ("temperature", 0.0),
}


def _to_celsius(v: float, u: str) -> float:
    u = {"celsius": "C", "fahrenheit": "F"}.get(u, u)
    return v if u == "C" else (v - 32) * 5 / 9 if u == "F" else v - 273.15


def _from_celsius(v: float, u: str) -> float:
    u = {"celsius": "C", "fahrenheit": "F"}.get(u, u)
    return v if u == "C" else v * 9 / 5 + 32 if u == "F" else v + 273.15


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Unit conversion used by convert_units (and by generators to compute expected answers)."""
    for u in (from_unit, to_unit):
        if u not in UNITS:
            raise ToolError(ErrorCode.UNSUPPORTED_VALUE, f"unit {u!r} is not supported",
                            hint="supported units: " + ", ".join(sorted(UNITS)))
    (da, fa), (db, fb) = UNITS[from_unit], UNITS[to_unit]
    if da != db:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, f"cannot convert {da} ({from_unit}) to {db} ({to_unit})")
    if da == "temperature":
        return round(_from_celsius(_to_celsius(value, from_unit), to_unit), 4)
    return round(value * fa / fb, 4)


@handler("convert_units", "converter", "utilities", "read", "Convert a value between units of length, mass, volume, speed or temperature.",
         {"value": {"type": "number"}, "from_unit": {"type": "string", "minLength": 1, "maxLength": 20},
          "to_unit": {"type": "string", "minLength": 1, "maxLength": 20}}, ["value", "from_unit", "to_unit"],
         errors=("UNSUPPORTED_VALUE",))
def convert_units(world: World, a: dict[str, Any]) -> Any:
    return {"value": convert(a["value"], a["from_unit"], a["to_unit"]), "unit": a["to_unit"]}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float:
    """Safe arithmetic: numbers, + - * / % ** and parentheses."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, "expression may only contain numbers, + - * / % ** and parentheses")

    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
        value = ev(tree)
    except ToolError:
        raise
    except ZeroDivisionError:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, "division by zero") from None
    except (SyntaxError, ValueError, OverflowError, RecursionError, TypeError):
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"cannot evaluate expression {expression!r}") from None
    if isinstance(value, complex) or value != value or abs(value) > 1e15:
        raise ToolError(ErrorCode.UNSUPPORTED_VALUE, "result out of range")
    return round(float(value), 6)


@handler("calculate", "calculator", "utilities", "read", "Evaluate an arithmetic expression (numbers, + - * / % ** and parentheses).",
         {"expression": {"type": "string", "minLength": 1, "maxLength": 200}}, ["expression"], errors=("UNSUPPORTED_VALUE",))
def calculate(world: World, a: dict[str, Any]) -> Any:
    return {"result": evaluate(a["expression"])}


RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.2, "CAD": 1.36, "AUD": 1.52, "CHF": 0.88, "MXN": 17.1,
         "INR": 83.2, "KRW": 1335.0}


def fx(amount: float, src: str, dst: str) -> float:
    """`amount` of currency `src` in `dst` at the fixed RATES, to cents."""
    return round(amount / RATES[src] * RATES[dst], 2)


@handler("convert_currency", "converter", "utilities", "read", "Convert an amount between currencies at today's rate.",
         {"amount": {"type": "number", "minimum": 0}, "from_currency": {"type": "string", "enum": list(RATES)},
          "to_currency": {"type": "string", "enum": list(RATES)}}, ["amount", "from_currency", "to_currency"],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def convert_currency(world: World, a: dict[str, Any]) -> Any:
    return {"amount": fx(a["amount"], a["from_currency"], a["to_currency"]), "currency": a["to_currency"],
            "rate": round(RATES[a["to_currency"]] / RATES[a["from_currency"]], 6)}
