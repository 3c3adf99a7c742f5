"""The pre-registered test set (issue 53, docs/preregistered.md): the committed list rebuilds exactly, drift is
caught loudly, and no code path outside evaluation reads it (so nothing is selected or tuned on it)."""
import ast
import collections
import dataclasses
import json
import os
import pathlib

import pytest

from mpa_jax.envs import CATEGORIES, DOMAINS
from mpa_jax.eval import tasks as et

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The names through which the list is reached; any use of one of them (a call, an import, an attribute, the
# split name as a string) counts as reading it.
LIST_NAMES = {"PREREGISTERED", "PREREGISTERED_FILE", "preregistered_tasks", "evaluation_tasks", "build_preregistered"}
LIST_STRINGS = {"preregistered", "preregistered_test.json"}
# file -> the functions allowed to reach the list ("<module>": module scope). Evaluation code only.
ALLOWED = {
    "mpa_jax/eval/tasks.py": None,  # the loader itself: anywhere
    "mpa_jax/eval/__init__.py": {"<module>"},  # re-export
    "mpa_jax/eval/evaluator.py": {"evaluate"},
    "mpa_jax/loop.py": {"heldout"},  # the loop's evaluation stage's task selection
    "mpa_jax/commands/eval.py": {"run", "add_arguments"},
    # the pre-registered RL experiment's evaluation of a finished arm (its only reader; RL never sees the list)
    "mpa_jax/experiments/prereg.py": {"evaluate_on_test_set"},
}
# where selection, tuning and training live: none of these may mention the list at all
FORBIDDEN_DIRS = ("mpa_jax/rl", "mpa_jax/data", "mpa_jax/sft", "mpa_jax/train", "mpa_jax/rollout", "mpa_jax/experiments",
                  "envs", "harness", "kernels", "bench")


@pytest.fixture(scope="module")
def doc():
    with open(et.PREREGISTERED_FILE, encoding="utf-8") as f:
        return json.load(f)


def _source_files():
    for top in ("mpa_jax", "envs", "harness", "kernels", "bench", "configs"):
        base = ROOT / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), p


def _list_uses(tree):
    """(enclosing function name or "<module>", what) for every node of `tree` that names the list."""
    out = []

    def visit(node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope = node.name
        hit = None
        if isinstance(node, ast.Name) and node.id in LIST_NAMES:
            hit = node.id
        elif isinstance(node, ast.Attribute) and node.attr in LIST_NAMES:
            hit = node.attr
        elif isinstance(node, ast.alias) and (node.name in LIST_NAMES or (node.asname or "") in LIST_NAMES):
            hit = node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in LIST_STRINGS:
            hit = repr(node.value)
        if hit:
            out.append((scope, hit))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, "<module>")
    return out


def test_the_committed_list_rebuilds_exactly_and_is_stratified(doc):
    rb = doc["rebuild"]
    assert rb["split"] == "test"
    rebuilt = et.build_preregistered(**rb, registered=doc["registered"], commit=doc["commit"])
    assert rebuilt == doc  # same ids, order, hashes and demo subset from the recorded split / seed / per_template
    groups = collections.Counter(e["group"] for e in doc["tasks"])
    assert groups == {"seen": rb["n_seen"], "held_out": rb["n_held_out"]} and len({e["id"] for e in doc["tasks"]}) == 600
    for g in ("seen", "held_out"):  # stratified: every domain and every category in both parts
        part = [e for e in doc["tasks"] if e["group"] == g]
        assert {e["domain"] for e in part} == set(DOMAINS) and {e["category"] for e in part} == set(et.PREREGISTERED_CATEGORIES)
    assert set(et.PREREGISTERED_CATEGORIES) <= set(CATEGORIES)  # categories added later (followup) stay outside it
    tasks = et.preregistered_tasks()
    assert [t.id for t in tasks] == [e["id"] for e in doc["tasks"]] and all(t.split == "test" for t in tasks)
    # the demo's / loop's 48: the first 32 of the seen part and the first 16 of the held-out part
    demo = et.evaluation_tasks(et.PREREGISTERED, n_seen=32, n_held_out=16)
    assert [t.id for t in demo] == doc["subsets"]["demo"] == [t.id for t in et.preregistered_tasks("demo")]
    assert [et.template_group(t.template) for t in demo] == ["seen"] * 32 + ["held_out"] * 16
    assert len({t.domain for t in demo}) == len(DOMAINS)


def test_a_changed_or_missing_task_is_caught(doc, tmp_path, monkeypatch):
    # a tampered list entry (its hash) ...
    bad = json.loads(json.dumps(doc))
    bad["tasks"][7]["sha256"] = "0" * 64
    path = tmp_path / "list.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(et.PreregisteredError, match=f"1 changed content.*{bad['tasks'][7]['id']}"):
        et.preregistered_tasks(path=path)
    # ... a task whose generated content changed (a one-word edit of its instruction) ...
    import mpa_jax.envs as envs

    real = envs.load_tasks
    victim = doc["tasks"][123]["id"]

    def drifted(*a, **k):
        return [dataclasses.replace(t, instruction=t.instruction + " please") if t.id == victim else t for t in real(*a, **k)]

    monkeypatch.setattr(envs, "load_tasks", drifted)
    with pytest.raises(et.PreregisteredError, match=f"changed content.*{victim}"):
        et.evaluation_tasks(et.PREREGISTERED, n_seen=32, n_held_out=16)
    # ... and a task no longer generated
    monkeypatch.setattr(envs, "load_tasks", lambda *a, **k: [t for t in real(*a, **k) if t.id != victim])
    with pytest.raises(et.PreregisteredError, match=f"1 no longer generated.*{victim}"):
        et.preregistered_tasks()
    monkeypatch.setattr(envs, "load_tasks", real)
    assert len(et.preregistered_tasks("demo")) == 48
    with pytest.raises(et.PreregisteredError, match="unknown subset 'dev'"):
        et.preregistered_tasks("dev")


def test_no_code_path_outside_evaluation_reads_the_list():
    """Only evaluation code (eval/, the loop's evaluation task selection, `mpa eval`, the pre-registered experiment's
    evaluation of a finished arm) names the list; RL, data, SFT, the harness, envs, kernels and benches never do. The list file itself is
    opened only by `eval/tasks.py`; the split name is refused by `select_tasks` and by `envs.load_tasks`, which
    every training-side task selection goes through."""
    readers = {}
    for rel, p in _source_files():
        text = p.read_text(encoding="utf-8")
        uses = _list_uses(ast.parse(text, filename=rel))
        if "preregistered_test.json" in text and rel != "mpa_jax/eval/tasks.py":
            uses.append(("<text>", "preregistered_test.json"))
        if uses:
            readers[rel] = uses
    for rel, uses in readers.items():
        assert rel in ALLOWED or not rel.startswith(FORBIDDEN_DIRS), f"{rel} reaches the pre-registered list: {uses}"
        if rel.startswith("configs/"):
            continue  # a config may name it as an evaluation split; checked below by value
        assert rel in ALLOWED, f"{rel} reaches the pre-registered list outside evaluation code: {uses}"
        allowed = ALLOWED[rel]
        assert allowed is None or {s for s, _ in uses} <= allowed, f"{rel}: {uses} outside {sorted(allowed)}"
    assert {"mpa_jax/loop.py", "mpa_jax/commands/eval.py", "mpa_jax/experiments/prereg.py"} <= set(readers)
    # configs name it only as an evaluation split
    from mpa_jax.config import load_config_file

    for name in sorted(os.listdir(ROOT / "configs")):
        if not name.endswith(".py") or name.startswith("_"):
            continue
        flat = _flatten(load_config_file(str(ROOT / "configs" / name)).to_dict())
        keys = {k for k, v in flat.items() if isinstance(v, str) and v.strip() == et.PREREGISTERED}
        assert keys <= {"loop.eval_split", "eval.split"}, f"configs/{name}: {sorted(keys)}"
    # the training side's loaders refuse the name
    from mpa_jax.envs import ContractError, load_tasks

    with pytest.raises(et.PreregisteredError, match="not a split to select from"):
        et.select_tasks(et.PREREGISTERED, n=4)
    with pytest.raises(ContractError, match="neither a split"):
        load_tasks(et.PREREGISTERED)


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
