"""BFCL v4 multi-turn data (from the `bfcl-eval` wheel) as project Tasks and ToolSpecs (no jax).

Read straight from the wheel's files: `data/BFCL_v4_multi_turn_<category>.json` (200 entries per category),
`data/possible_answer/` (ground truth: per user turn, the call strings BFCL executes) and
`data/multi_turn_func_doc/` (the tools of each backend class). The four categories share 200 scenarios:
entry i of every category has the same backend classes and task (the categories vary the phrasing, hold a
tool back, drop a parameter, or load a long context).

Mapping of BFCL's backend classes to the project's domains (a task's domain is its first gold call's class;
`path` in BFCL's data):

    GorillaFileSystem -> notes_files        MessageAPI        -> communication
    TwitterAPI        -> communication      TicketAPI         -> utilities
    TradingBot        -> payments_banking   TravelAPI         -> travel
    VehicleControlAPI -> navigation_rides   MathAPI           -> utilities

Splits are by scenario: the 200 scenario indices are ordered by a seeded hash (`split_seed`); the first
`test_scenarios` are test, the next `dev_scenarios` dev, the rest train. All four categories of a scenario
land in the same split, so no scenario is shared between train and test.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from mpa_jax.envs.contract import Task, ToolSpec

WHEEL = "bfcl-eval==2026.3.23"
INSTALL_HINT = f"pip install --no-deps {WHEEL} && pip install filelock mpmath  (make install-bench)"
CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
N_SCENARIOS = 200
CLASS_DOMAINS: dict[str, str] = {
    "GorillaFileSystem": "notes_files",
    "MessageAPI": "communication",
    "TwitterAPI": "communication",
    "TicketAPI": "utilities",
    "TradingBot": "payments_banking",
    "TravelAPI": "travel",
    "VehicleControlAPI": "navigation_rides",
    "MathAPI": "utilities",
}
# BFCL's words for the turn where a held-back tool comes back (its prompting-mode form puts the new tools'
# docs before them: the planner's tools are rendered once, so that is the form a chat-template model sees)
ADDED_TOOLS_PROMPT = "I have updated some more functions you can choose from. What about now?"


class BfclUnavailable(RuntimeError):
    """`bfcl-eval` is not installed (the message says how to install it)."""


def set_project_root(root: str = "") -> str:
    """Point BFCL_PROJECT_ROOT at a scratch folder before bfcl_eval is imported (else BFCL writes its result
    and lock folders next to site-packages); a root the user set is kept. Returns the root in use."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        root = root or os.path.join(tempfile.gettempdir(), "mpa-bfcl")
        os.makedirs(root, exist_ok=True)
        os.environ["BFCL_PROJECT_ROOT"] = root
    return os.environ["BFCL_PROJECT_ROOT"]


@functools.lru_cache(maxsize=1)
def package_dir() -> Path:
    """The installed bfcl_eval package folder."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclUnavailable(f"the bfcl env needs {WHEEL}: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def entries(category: str) -> dict[str, dict[str, Any]]:
    """BFCL's entries of one category by id, each with its `ground_truth` (per turn, the call strings)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r} (categories: {', '.join(CATEGORIES)})")
    data = package_dir() / "data"
    rows = _jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {r["id"]: r["ground_truth"] for r in _jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
    out = {}
    for r in rows:
        if r["id"] not in answers:
            raise ValueError(f"BFCL data: {r['id']} has no ground truth")
        if len(answers[r["id"]]) != len(r["question"]):
            raise ValueError(f"BFCL data: {r['id']} has {len(r['question'])} turns but {len(answers[r['id']])} answers")
        out[r["id"]] = {**r, "ground_truth": answers[r["id"]]}
    return out


def entry(bfcl_id: str) -> dict[str, Any]:
    """One entry by BFCL id (e.g. "multi_turn_miss_func_12")."""
    category = category_of(bfcl_id)
    try:
        return entries(category)[bfcl_id]
    except KeyError:
        raise ValueError(f"no BFCL entry {bfcl_id!r}") from None


def category_of(bfcl_id: str) -> str:
    """"multi_turn_miss_func_12" -> "miss_func"."""
    head = bfcl_id.rsplit("_", 1)[0]
    if not head.startswith("multi_turn_") or head[len("multi_turn_"):] not in CATEGORIES:
        raise ValueError(f"not a BFCL v4 multi-turn id: {bfcl_id!r}")
    return head[len("multi_turn_"):]


def scenario_of(bfcl_id: str) -> int:
    return int(bfcl_id.rsplit("_", 1)[1])


@functools.lru_cache(maxsize=None)
def class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend class, in its file's order."""
    from_file = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
                 "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
                 "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
    if class_name not in from_file:
        raise ValueError(f"BFCL class {class_name!r} is not a multi-turn backend")
    return tuple(_jsonl(package_dir() / "data" / "multi_turn_func_doc" / f"{from_file[class_name]}.json"))


def functions(e: dict[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], dict[int, list[tuple[str, dict[str, Any]]]]]:
    """(class, doc) pairs offered from the start, and those BFCL holds back until a turn (miss_func), as
    BFCL's `populate_test_cases_with_predefined_functions` does."""
    offered = [(c, d) for c in e["involved_classes"] for d in class_docs(c)]
    held: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for turn, names in (e.get("missed_function") or {}).items():
        for name in names:
            j = next(i for i, (_, d) in enumerate(offered) if d["name"] == name)
            held.setdefault(int(turn), []).append(offered.pop(j))
    return offered, held


_TYPES = {"dict": "object", "float": "number", "tuple": "array", "integer": "integer", "string": "string",
          "boolean": "boolean", "array": "array", "object": "object", "number": "number"}


def json_schema(schema: dict[str, Any], top: bool = False) -> dict[str, Any]:
    """A BFCL parameter doc as JSON Schema (its Python type names mapped; the top object closed)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value == "any":
                continue
            if value not in _TYPES:
                raise ValueError(f"BFCL doc: unknown type {value!r}")
            out["type"] = _TYPES[value]
        elif key == "properties":
            out["properties"] = {k: json_schema(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = json_schema(value)
        else:
            out[key] = value
    if top:
        out.setdefault("properties", {})
        out.setdefault("required", [])
        out["additionalProperties"] = False
    return out


def tool_spec(class_name: str, doc: dict[str, Any]) -> ToolSpec:
    """One BFCL function doc as a ToolSpec (app = the backend class)."""
    return ToolSpec(name=doc["name"], app=class_name, domain=CLASS_DOMAINS[class_name], description=doc["description"],
                    parameters=json_schema(doc["parameters"], top=True),
                    returns=json_schema(doc.get("response") or {"type": "dict"}))


@functools.lru_cache(maxsize=None)
def method_params(class_name: str) -> dict[str, tuple[str, ...]]:
    """Parameter names of each public method of a backend class (positional ground-truth arguments)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    return {name: tuple(p for p in inspect.signature(fn).parameters if p != "self")
            for name, fn in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def parse_call(text: str, classes: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string ("mv(source='a', destination='b')") as (name, keyword arguments)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"BFCL ground truth: not a plain call: {text!r}")
    name = node.func.id
    params = next((method_params(c)[name] for c in classes if name in method_params(c)), None)
    if params is None:
        raise ValueError(f"BFCL ground truth: {name} is not a method of {', '.join(classes)}")
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return name, args


def scenario_splits(seed: int, test_scenarios: int, dev_scenarios: int) -> dict[int, str]:
    """Scenario index -> split (module docstring)."""
    if test_scenarios < 1 or dev_scenarios < 0 or test_scenarios + dev_scenarios >= N_SCENARIOS:
        raise ValueError(f"config.envs.bfcl: test_scenarios ({test_scenarios}) and dev_scenarios ({dev_scenarios}) must"
                         f" leave train scenarios out of {N_SCENARIOS}")
    order = sorted(range(N_SCENARIOS), key=lambda i: hashlib.sha256(f"bfcl:{seed}:{i}".encode()).hexdigest())
    return {i: "test" if r < test_scenarios else "dev" if r < test_scenarios + dev_scenarios else "train"
            for r, i in enumerate(order)}


def user_text(turn: list[dict[str, Any]]) -> str:
    """The user's words of one BFCL turn (its messages joined)."""
    return "\n".join(str(m["content"]) for m in turn)


def gold_plan(e: dict[str, Any]) -> list[dict[str, Any]]:
    """Ground truth as an oracle plan: each turn's calls, then a message that closes the turn."""
    plan: list[dict[str, Any]] = []
    for turn, calls in enumerate(e["ground_truth"]):
        names = []
        for text in calls:
            name, args = parse_call(text, e["involved_classes"])
            plan.append({"kind": "tool_call", "name": name, "arguments": args, "why": f"I'll call {name}."})
            names.append(name)
        said = f"Done: {', '.join(dict.fromkeys(names))}." if names else \
            "I can't do that with the tools and details I have; please tell me what is missing."
        plan.append({"kind": "message", "text": said, "why": "That settles this request."})
    return plan


def make_tasks(split: str, *, split_seed: int, test_scenarios: int, dev_scenarios: int,
               categories: Sequence[str] = CATEGORIES) -> list[Task]:
    """The Tasks of `split` ("train" | "dev" | "test" | "all"), category by category in BFCL's order."""
    if split not in ("train", "dev", "test", "all"):
        raise ValueError(f"bfcl split must be train, dev, test or all, got {split!r}")
    splits = scenario_splits(split_seed, test_scenarios, dev_scenarios)
    out = []
    for cat in categories:
        for bfcl_id, e in entries(cat).items():
            sc = scenario_of(bfcl_id)
            if split != "all" and splits[sc] != split:
                continue
            offered, _ = functions(e)
            primary = e["path"][0].split(".")[0] if e.get("path") else e["involved_classes"][0]
            out.append(Task(
                id=f"bfcl/{bfcl_id}", domain=CLASS_DOMAINS[primary], category=f"bfcl_{cat}", difficulty=len(e["question"]),
                instruction=user_text(e["question"][0]), tools=[d["name"] for _, d in offered],
                verifier={"checker": "bfcl_eval multi_turn_checker", "bfcl_id": bfcl_id}, gold=gold_plan(e),
                template=f"bfcl_scenario_{sc}", split=splits[sc], seed=sc,
                metadata={"env": "bfcl", "bfcl_id": bfcl_id, "bfcl_category": cat, "scenario": sc,
                          "involved_classes": list(e["involved_classes"]), "user_turns": len(e["question"])}))
    return out
