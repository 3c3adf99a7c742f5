"""The rollout worker of the RL loop: tasks in, scored groups out; `sync(params, version)` moves the learner's
weights into the sampler. No jax.

    worker = RolloutWorker(source, runner, engine, tokenizer, rl=config.rl, rollout=config.rollout, seed=config.seed)
    rollouts = worker.rollouts(step, version, plan)  # the step's groups (the prefetched ones when there are)
    worker.prefetch(step + 1, plan)                  # async: the next step samples while this one trains
    worker.sync(params, version)                     # waits for the prefetch first: no weight swap mid-generation

A step draws `rl.tasks_per_step` groups from its `TaskSource`; with competence-aware selection (`plan`:
`Care.selection()`, the competence table as it stood when the step's sampling began and the keep rule priced
with it) templates are drawn by that table and only groups that `plan.keep(rollouts, group)` accepts (the
matched-arms rule, `rl/advantage.py`) are returned, drawing again until the step has `rl.tasks_per_step` of them
or `rl.select_tries` x that many groups were drawn. The groups left out keep their episodes in `Rollouts.unused`
(competence, failure mining).

Async (`rl.async_rollouts`): `prefetch(step + 1)` samples in a background thread with the weights of this step's
start while the learner trains; `sync` waits for it, so every trained rollout is exactly one version stale, and
rollouts more than `rl.max_staleness` versions old are dropped when the step takes them (`stale_dropped`).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mpa_jax.rl.advantage import Selection
from mpa_jax.rl.rollouts import Rollouts, group_rollouts
from mpa_jax.rl.tasks import TaskSource


class RolloutWorker:
    """The actor role (module docstring). `close()` ends its prefetch thread (not the runner or engine)."""

    def __init__(self, source: TaskSource, runner: Any, engine: Any, tokenizer: Any, *, rl: Any, rollout: Any, seed: int) -> None:
        self.source, self.runner, self.engine, self.tokenizer = source, runner, engine, tokenizer
        self.rl, self.rollout, self.seed = rl, rollout, int(seed)
        self.per_step = int(rl.tasks_per_step)
        self.async_mode, self.max_staleness = bool(rl.async_rollouts), int(rl.max_staleness)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rl-rollouts") if self.async_mode else None
        self._future: Future | None = None
        self._ready: Rollouts | None = None  # prefetched rollouts, finished
        self.stale_dropped = 0

    # ------------------------------------------------------------------ the step's groups
    def collect(self, step: int, plan: Selection | None = None) -> Rollouts:
        """Draw, roll out and (with selection, by `plan`) filter the groups of `step` now (module docstring)."""
        n = self.per_step
        table = plan.competence if plan is not None else None

        def run(want: int, attempt: int) -> Rollouts:
            return group_rollouts(self.runner, self.engine, self.tokenizer, self.source.draw(step, want, attempt, table),
                                  rl=self.rl, rollout=self.rollout, seed=self.seed, step=step, attempt0=attempt * 10)

        if self.source.selector is None:
            return run(n, 0)
        if plan is None:
            raise ValueError("RolloutWorker.collect: competence-aware selection needs the step's plan (Care.selection())")
        t0 = time.perf_counter()
        kept: Rollouts | None = None
        drawn = attempt = 0
        while (kept is None or len(kept.draws) < n) and drawn < n * self.source.tries:
            want = n - (len(kept.draws) if kept is not None else 0)
            r = run(want, attempt)
            drawn += want
            attempt += 1
            r = r.with_groups([g for g in range(len(r.draws)) if plan.keep(r, g)])
            kept = r if kept is None else kept.extend(r)
        assert kept is not None
        kept.rollout_s = time.perf_counter() - t0
        kept.drawn = drawn
        return kept

    def prefetch(self, step: int, plan: Selection | None = None) -> None:
        """Async mode: start sampling `step`'s groups in the background with the sampler's current weights."""
        if self._pool is None:
            raise RuntimeError("RolloutWorker.prefetch needs config.rl.async_rollouts = True")
        self._settle()
        self._future = self._pool.submit(self.collect, step, plan)

    def rollouts(self, step: int, version: int, plan: Selection | None = None) -> Rollouts:
        """`step`'s groups: the prefetched ones when they are for this step (their rollouts older than
        `rl.max_staleness` versions behind `version` dropped), else collected now."""
        self._settle()
        ready, self._ready = self._ready, None
        if ready is not None and ready.step == step:
            self.stale_dropped = ready.drop_stale(version, self.max_staleness) if self.async_mode else 0
            return ready
        self.stale_dropped = 0
        return self.collect(step, plan)

    def _settle(self) -> None:
        if self._future is not None:
            future, self._future = self._future, None
            self._ready = future.result()

    # ------------------------------------------------------------------ weights and state
    def sync(self, params: Any, version: int) -> float:
        """Wait for any prefetch (no weight swap mid-generation), then give the sampler the learner's weights as
        `version`; returns the seconds the weight update took (the engine copies: the train step donates)."""
        self._settle()
        t0 = time.perf_counter()
        self.engine.update_weights(params, str(version))
        return time.perf_counter() - t0

    def pending(self) -> Rollouts | None:
        """The prefetched rollouts not yet trained on (part of the run's state: saved with a checkpoint)."""
        self._settle()
        return self._ready

    def restore(self, prefetched: Rollouts | None) -> None:
        self._ready = prefetched

    def close(self) -> None:
        if self._future is not None:
            self._future.exception()  # wait for it; an error of a prefetch no step took is not this run's result
        if self._pool is not None:
            self._pool.shutdown(wait=True)
