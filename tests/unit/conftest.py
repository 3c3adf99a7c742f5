"""Fixtures shared by the external-benchmark tests (test_bfcl.py, test_agentdojo.py and the security tests on
AgentDojo): a module sets `BENCH_KIND = "bfcl" | "agentdojo"` and asks for `env` (that kind's env, one per module,
closed after it), `all_tasks` (its tasks of every split) and `tok` (a small synthetic-corpus tokenizer). A
module that defines a fixture of the same name uses its own.
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def env(request):
    """The env of the module's `BENCH_KIND`."""
    from mpa_jax.envs.base import BENCHMARK_KINDS, make_env

    kind = getattr(request.module, "BENCH_KIND", None)
    if kind not in BENCHMARK_KINDS:
        raise pytest.UsageError(f"{request.module.__name__}: the shared `env` fixture needs BENCH_KIND set to one of "
                                f"{', '.join(BENCHMARK_KINDS)} (got {kind!r})")
    e = make_env(kind)
    yield e
    e.close()


@pytest.fixture(scope="module")
def all_tasks(env):
    """Every task of the benchmark (all splits)."""
    return env.tasks("all")


@pytest.fixture(scope="module")
def tok():
    """A small tokenizer over the synthetic corpus (vocabulary 2,048)."""
    from mpa_jax import tokenizer as tk

    return tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
