"""The env protocol every kind implements, and `make_env(kind, config=None, **kwargs)` (kwargs from `config.envs.<kind>`).

Kinds: "sandbox" (programmatic, `envs/sandbox.py`), "simulated" (LLM-simulated long-tail apps,
`envs/simulated/`), "adb" (an Android device, `envs/adb/env.py`), and external benchmarks run on their own
code and checkers: "bfcl" (BFCL v4 multi-turn, `envs/bfcl/`), "agentdojo" (AgentDojo's suites,
`envs/agentdojo/`). Factories are imported lazily so that `import mpa_jax.envs` does not pull in adbutils,
bfcl_eval or agentdojo.

An external benchmark's tasks come from the env itself (`kind_tasks(kind, config, split)`: the env's
`tasks(split)`), each with `metadata["env"]` naming its kind, so a runner routes it to that kind wherever
it appears (eval, oracle, the RL mixture).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Protocol, runtime_checkable

from mpa_jax.envs.contract import Feedback, Task, ToolSpec, Verification

POOL_KEYS = ("concurrency", "timeout_s")  # config.envs.<kind> keys the worker pool reads, not the env


class EnvFault(RuntimeError):
    """An env's report that the world failed (a device lost, a backend down): infra, never a reward and never a
    bug. An env raises it (or answers INFRA/TIMEOUT Feedback) for such faults; any other exception from an env
    is a programming error and fails the run with its traceback (`envs.episode`, `envs.pool`)."""


class EnvUnavailable(EnvFault):
    """The env cannot run episodes at all (e.g. a device that stays unreachable after the reconnect attempts).

    Raised by `reset`. Unlike a fault inside one episode (INFRA Feedback, the episode marked infra), it
    means every later episode would fail the same way: a run stops on it with this one message instead of
    spending the reconnect time on each remaining task.
    """


@runtime_checkable
class Env(Protocol):
    """One episode at a time: reset(task) -> observation, step(action) -> Feedback, verify(), close()."""

    kind: str

    def tool_specs(self, task: Task) -> list[ToolSpec]: ...

    def reset(self, task: Task) -> dict[str, Any]: ...

    def step(self, action: Any) -> Feedback: ...

    def verify(self) -> Verification: ...

    def close(self) -> None: ...


ENV_KINDS: dict[str, Any] = {
    "sandbox": "mpa_jax.envs.sandbox:SandboxEnv",
    "simulated": "mpa_jax.envs.simulated:SimulatedEnv",
    "adb": "mpa_jax.envs.adb.env:AdbEnv",
    "bfcl": "mpa_jax.envs.bfcl.env:BfclEnv",
    "agentdojo": "mpa_jax.envs.agentdojo.env:AgentDojoEnv",
}
# kinds whose tasks are a benchmark's own (not the sandbox's generated splits): `kind_tasks`
BENCHMARK_KINDS: tuple[str, ...] = ("bfcl", "agentdojo")


def register_env(kind: str, factory: Any) -> None:
    """Register another env kind (a class/callable, or "module:attr" imported on first use)."""
    ENV_KINDS[kind] = factory


def _factory(kind: str) -> Callable[..., Any]:
    if kind not in ENV_KINDS:
        raise ValueError(f"unknown env kind {kind!r} (available: {', '.join(sorted(ENV_KINDS))})")
    f = ENV_KINDS[kind]
    if isinstance(f, str):
        module, _, attr = f.partition(":")
        f = ENV_KINDS[kind] = getattr(importlib.import_module(module), attr)
    return f


def env_kwargs(config: Any, kind: str) -> dict[str, Any]:
    """`config.envs.<kind>` as env kwargs (pool keys dropped); {} when the config has no such section."""
    if config is None or "envs" not in config or kind not in config.envs:
        return {}
    section = config.envs[kind]
    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    return {k: v for k, v in d.items() if k not in POOL_KEYS}


def make_env(kind: str = "sandbox", config: Any = None, **kwargs: Any) -> Any:
    """An env of `kind`; kwargs come from `config.envs.<kind>` and the context format from `config.context`
    (`envs.context.ContextFormat`); explicit kwargs override them.

    An option the env does not take raises ValueError naming `config.envs.<kind>.<key>`.
    """
    factory = _factory(kind)
    merged = {**env_kwargs(config, kind), **kwargs}
    if config is not None and "context" not in merged and "context" in config:  # a bare envs section keeps the default
        from mpa_jax.envs.context import ContextFormat

        merged["context"] = ContextFormat.from_config(config)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key in merged:
            if key not in params:
                raise ValueError(f"config.envs.{kind}.{key}: not an option of the {kind} env"
                                 f" (options: {', '.join(sorted(params)) or 'none'})")
    return factory(**merged)


def kind_tasks(kind: str, config: Any, split: str) -> list[Task]:
    """The tasks of an external benchmark kind's `split` (train | dev | test | all), from its env's
    `tasks(split)` with the options of `config.envs.<kind>`."""
    if kind not in BENCHMARK_KINDS:
        raise ValueError(f"env kind {kind!r} has no tasks of its own (benchmark kinds: {', '.join(BENCHMARK_KINDS)})")
    env = make_env(kind, config)
    try:
        return env.tasks(split)
    finally:
        env.close()


def kind_split_file(kind: str, config: Any, split: str, workdir: str) -> str:
    """`split` of a benchmark kind as a task JSONL under `workdir` (what `mpa oracle`/`mpa eval --env KIND` read):
    `<workdir>/tasks-<kind>-<split>.jsonl`. A `split` that is already a file is returned as it is."""
    import os

    from mpa_jax.envs.contract import write_jsonl

    if os.path.isfile(split):
        return split
    path = os.path.join(workdir, f"tasks-{kind}-{split}.jsonl")
    os.makedirs(workdir, exist_ok=True)
    write_jsonl(path, kind_tasks(kind, config, split))  # type: ignore[arg-type]
    return path
