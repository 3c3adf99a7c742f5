"""Issue 55 item 7: the tests test public behaviour and no fixed sleep decides a result.

Every file under tests/ is parsed (ast, not grep) and checked for
- private names of the package: `from mpa_jax... import _name` (or a private module in the path), `x._name`
  where the chain starts at a name imported from the package, and `setattr/getattr/monkeypatch.setattr(x,
  "_name", ...)` or `monkeypatch.setattr("mpa_jax.mod._name", ...)`; dunder names (`__version__`) are public;
- `sleep(c)` calls (time.sleep, asyncio.sleep, a bare `sleep`) with c >= 1 s, a number or a module-level
  `NAME = number`, except the fakes in
  SLOW_FAKES, which are slow on purpose so that a timeout under test fires.
Objects a test builds itself (`client = SGLangEngine(...)`) are not traced: the rule stays simple and exact.
"""
from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"mpa_jax", "envs", "harness", "kernels"}
LONG_SLEEP_S = 1.0

# (file under tests/, enclosing function) -> why it sleeps: a fake that must outlast the caller's timeout.
SLOW_FAKES = {
    ("unit/test_harness_backends.py", "do_POST"): "an HTTP backend that answers after the client's timeout (TIMEOUT feedback)",
    ("data/mcp_probe_server.py", "hang"): "an MCP tool that never answers (the client's call timeout must end it)",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in PACKAGES


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the innermost function that holds it ("" at module level)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def violations(source: str, rel: str) -> list[str]:
    """The rule's findings in one file's source, as "rel:line: what", in line order."""
    tree = ast.parse(source)
    found: list[str] = []
    imported: set[str] = set()  # names bound to the package's modules, classes and functions
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _ours(node.module):
            for alias in node.names:
                if _private(alias.name) or any(_private(p) for p in node.module.split(".")):
                    found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append(f"{rel}:{node.lineno}: import {alias.name}")
                    imported.add(alias.asname or alias.name.split(".")[0])
    owner = _functions(tree)
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        if not isinstance(node, ast.Call) or not node.args:
            continue
        first = node.args[0]
        second = node.args[1] if len(node.args) > 1 else None
        if (isinstance(first, ast.Name) and first.id in imported and isinstance(second, ast.Constant)
                and isinstance(second.value, str) and _private(second.value)):
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}({first.id}, {second.value!r}, ...)")
        if (isinstance(first, ast.Constant) and isinstance(first.value, str) and _ours(first.value)
                and "." in first.value and " " not in first.value and any(_private(p) for p in first.value.split("."))):
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}({first.value!r}, ...)")
        func = node.func
        is_sleep = (isinstance(func, ast.Attribute) and func.attr == "sleep") or (isinstance(func, ast.Name) and func.id == "sleep")
        seconds = first.value if isinstance(first, ast.Constant) else constants.get(getattr(first, "id", None))
        if (is_sleep and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                and seconds >= LONG_SLEEP_S and (rel, owner.get(node, "")) not in SLOW_FAKES):
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)} in {owner.get(node) or 'module level'}")
    return sorted(found, key=lambda v: int(v.split(":")[1]))  # stable: one line's findings keep their order


def test_no_test_reaches_into_private_names_or_sleeps_for_a_result():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100  # the walk saw the tests
    found = [v for f in files for v in violations(f.read_text(), f.relative_to(TESTS).as_posix())]
    assert found == []


def test_every_allowed_slow_fake_still_exists():
    """An allow-list entry whose sleep is gone would silently allow a new one: each must still match a call."""
    for rel, func in SLOW_FAKES:
        tree = ast.parse((TESTS / rel).read_text())
        owner = _functions(tree)
        assert any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("sleep") and owner.get(n) == func
                   for n in ast.walk(tree)), (rel, func)


def test_the_rule_catches_what_it_is_for():
    bad = '''
from mpa_jax.hostmem import _thp_mode
from mpa_jax._private import thing
import mpa_jax.sft.trainer as trainer
from mpa_jax import hostmem
from mpa_jax.rollout.sglang import SGLangEngine
import time, asyncio
FIRST_RETRY_S = 2.0

def test_x(monkeypatch):
    hostmem._thp_mode()
    trainer.state._cache.clear()
    SGLangEngine._client
    monkeypatch.setattr(hostmem, "_thp_mode", lambda: "never")
    monkeypatch.setattr("mpa_jax.hostmem._thp_mode", lambda: "never")
    time.sleep(2)
    asyncio.sleep(1.5)
    time.sleep(FIRST_RETRY_S)
'''
    got = [v.split(": ", 1)[1] for v in violations(bad, "unit/test_bad.py")]
    assert got == [
        "from mpa_jax.hostmem import _thp_mode",
        "from mpa_jax._private import thing",
        "hostmem._thp_mode",
        "trainer.state._cache",
        "SGLangEngine._client",
        "monkeypatch.setattr(hostmem, '_thp_mode', ...)",
        "monkeypatch.setattr('mpa_jax.hostmem._thp_mode', ...)",
        "time.sleep(2) in test_x",
        "asyncio.sleep(1.5) in test_x",
        "time.sleep(FIRST_RETRY_S) in test_x",
    ], got
    good = '''
import time
import pytest
POLL_S = 0.05
from mpa_jax import hostmem, __version__
from mpa_jax.envs import tools_used

class Local:
    def _helper(self):
        return self._x

def test_y(capsys):
    hostmem.thp_mode()
    hostmem.__doc__
    Local()._helper()
    capsys._capture  # a third party's internals are not this rule's business
    time.sleep(0.05)
    time.sleep(POLL_S)
'''
    assert violations(good, "unit/test_good.py") == []
