"""The RL package's shape (issue 50): the actor side and the advantage maths import no jax, experiment drivers are
imported by their command only, the whole config stops at `run_rl` (sections are passed down), and the loop hands
run_rl its task source instead of rewriting config.rl."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_JAX = ("tasks", "rollouts", "worker", "care", "competence", "advantage", "step_log", "errors")


def _imports(path: Path) -> set[str]:
    """Module names a file imports at any depth, TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_actor_side_and_maths_import_no_jax():
    for name in NO_JAX:
        mods = _imports(ROOT / "mpa_jax" / "rl" / f"{name}.py")
        bad = {m for m in mods if m.split(".")[0] in ("jax", "flax", "optax")
               or m in {f"mpa_jax.rl.{x}" for x in ("learner", "loss", "update", "batch", "trainer", "start")}}
        assert not bad, (name, bad)


def test_experiment_drivers_are_imported_by_their_command_only():
    users = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "mpa_jax").rglob("*.py")
                   if any(m.startswith("mpa_jax.experiments") for m in _imports(p))
                   and "experiments" not in p.relative_to(ROOT / "mpa_jax").parts[:1])  # drivers may share helpers
    assert users == ["mpa_jax/commands/experiment.py"], users
    assert not list((ROOT / "mpa_jax" / "rl").glob("lift.py")) and not list((ROOT / "mpa_jax" / "rl").glob("experiment.py"))


def test_the_loop_does_not_rewrite_the_rl_task_source():
    text = (ROOT / "mpa_jax" / "loop.py").read_text()
    assert not re.search(r"\.rl\.(selection|split|select_prior)\s*=", text)
    assert re.search(r"run_rl\([^)]*split=split,\s*selection=selection, prior=prior\)", text)


def test_the_whole_config_stops_at_run_rl():
    """In rl/, only `run_rl` takes the whole experiment config (by the project's convention a parameter named
    `config`; sections are named after their section), and it hands it on only to fit the start
    (`mpa_jax.start.fit_start`) and to read the sharding rules; roles and factories get sections."""
    takers, passed = [], []
    for path in sorted((ROOT / "mpa_jax" / "rl").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    a.arg == "config" for a in node.args.args + node.args.kwonlyargs):
                takers.append(f"{path.name}:{node.name}")
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == "config"
                                                  for a in list(node.args) + [k.value for k in node.keywords]):
                passed.append(f"{path.name}:{ast.unparse(node.func)}")
    assert takers == ["trainer.py:run_rl"], takers
    assert sorted(passed) == ["trainer.py:fit_start", "trainer.py:sharding.rules_from_config"], passed
