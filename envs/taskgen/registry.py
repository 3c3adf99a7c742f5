"""The template registry: Template, the TEMPLATES list, the `template` decorator and Ctx.

A template is `fn(ctx) -> dict | None` returning the task's instruction, gold plan, verifier and extras;
None means "this instance cannot be built" (the generator draws another seed). Templates register as
their modules are imported; `envs/taskgen/__init__.py` fixes that order, which is the order of tasks in
every split (pinned by tests/unit/test_envs_fingerprint.py).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any, Callable

from mpa_jax.envs.catalog import ENTITY_BY_NAME, Entity, Field
from mpa_jax.envs.world import persona_world, sample_value, stable_hash

GENERATOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Template:
    """A registered task generator: its name, where its tasks count, and `fn(ctx)` that builds one."""
    name: str
    domain: str
    category: str
    difficulty: int
    fn: Callable[["Ctx"], dict[str, Any] | None]
    weight: float = 1.0  # relative number of instances per split
    family: str = ""  # skill family (skills tasks share a procedure)

    @property
    def held_out(self) -> bool:
        """About one template in eight never appears in train (template-level hold-out)."""
        return stable_hash("holdout", self.name) % 8 == 0 and not self.name.startswith("seed")


TEMPLATES: list[Template] = []


class Ctx:
    """What a template may read: the persona facts and rows of its world, and a seeded rng."""

    def __init__(self, persona_seed: int, rng: random.Random) -> None:
        self.persona, _, rows = persona_world(persona_seed)
        self.rng = rng
        self._rows = rows

    @property
    def today(self) -> dt.date:
        return dt.date.fromisoformat(self.persona.now[:10])

    def rows(self, e: Entity | str) -> list[dict[str, Any]]:
        e = ENTITY_BY_NAME[e] if isinstance(e, str) else e
        return [{"id": f"{e.name}_{i + 1}", **r} for i, r in enumerate(self._rows[e.name])]

    def row(self, e: Entity | str, rid: str) -> dict[str, Any]:
        e = ENTITY_BY_NAME[e] if isinstance(e, str) else e
        return {"id": rid, **self._rows[e.name][int(rid.rsplit("_", 1)[1]) - 1]}

    def value(self, f: Field) -> Any:
        return sample_value(f, self.rng, self.today)

    def choice(self, xs: list[Any]) -> Any:
        return self.rng.choice(xs)


def template(name: str, domain: str, category: str, difficulty: int = 1, weight: float = 1.0, family: str = ""):
    """Decorator registering `fn(ctx)` as template `name` (appended to TEMPLATES)."""
    def wrap(fn: Callable[[Ctx], dict[str, Any] | None]) -> Callable:
        TEMPLATES.append(Template(name, domain, category, difficulty, fn, weight, family))
        return fn
    return wrap
