"""The hybrid mixture: episodes drawn across env kinds (sandbox, simulated, adb) by configured weights.

`MixtureSampler(weights, tasks_by_kind, seed).sample(n)` gives a seeded list of (kind, task) draws: the
kind by weight, then the kind's tasks in a shuffled cycle. `run_round_robin` drives a set of episodes in
rounds, stepping every live episode of a round concurrently through an `EnvPool` (per-kind concurrency
and timeouts), and returns per-kind metrics; the agent loop does the same with model-generated actions.
"""
from __future__ import annotations

import collections
import random
import time
from typing import Any, Callable, Sequence

from mpa_jax.envs.contract import Action, Feedback, Task, Verification
from mpa_jax.envs.pool import EnvPool

KINDS = ("sandbox", "simulated", "adb")


class MixtureSampler:
    """Seeded draws of (kind, task) by weight. Kinds with weight 0 or no tasks are never drawn."""

    def __init__(self, weights: dict[str, float], tasks: dict[str, Sequence[Task]], seed: int = 0) -> None:
        for kind, w in weights.items():
            if w < 0:
                raise ValueError(f"config.envs.mixture.{kind}: weight must be >= 0, got {w}")
            if w > 0 and not tasks.get(kind):
                raise ValueError(f"config.envs.mixture.{kind}: weight {w} but no {kind} tasks were given")
        self.kinds = [k for k, w in weights.items() if w > 0]
        if not self.kinds:
            raise ValueError("config.envs.mixture: every weight is 0")
        self.weights = [float(weights[k]) for k in self.kinds]
        self.tasks = {k: list(tasks[k]) for k in self.kinds}
        self.rng = random.Random(seed)
        self._order: dict[str, list[Task]] = {k: [] for k in self.kinds}

    @classmethod
    def from_config(cls, config: Any, tasks: dict[str, Sequence[Task]], seed: int | None = None) -> "MixtureSampler":
        mix = config.envs.mixture
        weights = {k: float(mix[k]) for k in mix.keys()}
        return cls(weights, tasks, int(config.seed) if seed is None else seed)

    def _next_task(self, kind: str) -> Task:
        if not self._order[kind]:
            order = list(self.tasks[kind])
            self.rng.shuffle(order)
            self._order[kind] = order
        return self._order[kind].pop()

    def sample(self, n: int) -> list[tuple[str, Task]]:
        """`n` draws; the kind of each by weight."""
        kinds = self.rng.choices(self.kinds, weights=self.weights, k=n)
        return [(k, self._next_task(k)) for k in kinds]


Policy = Callable[[str, Task, int, Any], Action | None]  # (kind, task, turn, last feedback/observation) -> action


def run_round_robin(draws: Sequence[tuple[str, Task]], make_env: Callable[[str], Any], policy: Policy, pool: EnvPool,
                    max_turns: int = 16, max_live: dict[str, int] | None = None) -> dict[str, Any]:
    """Run every drawn episode; each round steps all live episodes concurrently through `pool`.

    `max_live[kind]` caps the episodes of a kind in flight at once (a device holds one episode: adb
    defaults to 1); the others wait and start as earlier ones end. An episode is verified as soon as it
    ends (before its device is reused). Resets and verifications go through the pool too.
    Returns {"verifications": [Verification per draw], "per_kind": {kind: metrics}, "wall_s": float}.
    """
    t0 = time.perf_counter()
    cap = {"adb": 1, **(max_live or {})}
    n = len(draws)
    envs: list[Any] = [None] * n
    last: list[Any] = [None] * n
    turn = [0] * n
    infra = [False] * n
    verifications: list[Verification | None] = [None] * n
    pending = collections.deque(range(n))
    live: list[int] = []
    in_flight: collections.Counter = collections.Counter()

    def finish(ids: list[int]) -> None:
        ver = pool.call_all([(envs[i], envs[i].verify, "") for i in ids])
        for i, v in zip(ids, ver):
            if infra[i] or not isinstance(v, Verification):
                v = Verification(success=False, score=0.0, infra_error=True)
            verifications[i] = v
            try:
                envs[i].close()
            except Exception:  # noqa: BLE001 - closing a lost device must not lose the results
                pass
            pool.release(envs[i])
            in_flight[draws[i][0]] -= 1

    while pending or live:
        starting, waiting = [], collections.deque()
        while pending:
            i = pending.popleft()
            kind = draws[i][0]
            if in_flight[kind] < cap.get(kind, n):
                in_flight[kind] += 1
                starting.append(i)
            else:
                waiting.append(i)
        pending = waiting
        for i in starting:
            envs[i] = make_env(draws[i][0])
        obs = pool.call_all([(envs[i], (lambda e=envs[i], t=draws[i][1]: e.reset(t)), "") for i in starting])
        for i, o in zip(starting, obs):
            last[i] = o
            infra[i] = isinstance(o, Feedback)  # a failed reset answers INFRA Feedback
        live += starting
        actions = {i: None if infra[i] or turn[i] >= max_turns else policy(draws[i][0], draws[i][1], turn[i], last[i])
                   for i in live}
        done = [i for i in live if actions[i] is None]
        stepping = [i for i in live if actions[i] is not None]
        fbs = pool.step_all([(envs[i], actions[i]) for i in stepping])
        live = []
        for i, fb in zip(stepping, fbs):
            last[i], turn[i] = fb, turn[i] + 1
            if fb.is_infra:
                infra[i] = True
            if fb.is_infra or actions[i].kind in ("message", "finish"):
                done.append(i)
            else:
                live.append(i)
        if done:
            finish(done)
    per_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (kind, _), v, steps in zip(draws, verifications, turn):
        m = per_kind[kind]
        m["episodes"] += 1
        m["steps"] += steps
        m["infra"] += int(v.infra_error)
        m["success"] += int(v.success)
    pool_stats = pool.summary()
    metrics = {}
    for kind, m in sorted(per_kind.items()):
        scored = m["episodes"] - m["infra"]
        metrics[kind] = {"episodes": m["episodes"], "steps": m["steps"], "infra": m["infra"],
                         "success_rate": m["success"] / scored if scored else 0.0,
                         **{k: v for k, v in pool_stats.get(kind, {}).items() if k in ("timeouts", "mean_busy_ms", "mean_wait_ms")}}
    return {"verifications": verifications, "per_kind": metrics, "wall_s": time.perf_counter() - t0}


def gold_policy(kind: str, task: Task, turn: int, last: Any) -> Action | None:
    """Replays a task's gold actions in order (tests and benches); None after the last one."""
    if turn >= len(task.gold):
        return None
    g = task.gold[turn]
    if g["kind"] == "tool_call":
        return Action.tool_call(g["name"], g.get("arguments", {}), call_id=f"call_{turn}")
    if g["kind"] == "message":
        return Action.message(g["text"])
    if g["kind"] == "delegate":
        return Action.delegate(g.get("name") or g.get("agent", ""), g.get("text") or g.get("instruction", ""))
    return Action.finish()
