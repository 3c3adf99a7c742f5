"""Worker pools per env kind: concurrency limits and timeouts, so one slow device never holds up the rest.

`EnvPool({"sandbox": KindLimits(64, 30.0), "adb": KindLimits(1, 60.0)})` runs env calls (`reset`, `step`,
`verify`) on a thread pool per kind with at most `concurrency` calls of that kind in flight. `step_all`
steps a whole round of episodes at once and returns when every call has answered or its kind's timeout has
passed: a call past its timeout answers TIMEOUT Feedback, and its env is quarantined (every later call
through the pool answers INFRA at once) because the abandoned call may still change its state. Threads are
enough: sandbox calls are sub-millisecond SQLite work and device/simulator calls wait on sockets.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.contract import ErrorCode, Feedback


@dataclasses.dataclass(frozen=True)
class KindLimits:
    """Per-kind limits: calls in flight at once, seconds one call may take.

    `concurrency=0` runs the kind inline in the caller's thread (no timeout): for the sandbox, whose calls
    are sub-millisecond CPU work that threads only slow down (bench/sandbox.py measures both).
    """

    concurrency: int  # no defaults: configs/ (`config.envs.<kind>`) is the one source of them
    timeout_s: float

    def __post_init__(self) -> None:
        if self.concurrency < 0:
            raise ValueError(f"concurrency must be >= 0 (0 = inline), got {self.concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def limits_from_config(config: Any) -> dict[str, KindLimits]:
    """`config.envs.<kind>.{concurrency,timeout_s}` for every env kind section of `config.envs` (`kind` and
    `mixture` are no kinds); a section without them is an error naming the key."""
    out = {}
    for kind, section in config.envs.items():
        if kind == "mixture" or not hasattr(section, "keys"):
            continue
        missing = [key for key in ("concurrency", "timeout_s") if key not in section]
        if missing:
            raise ValueError(f"config.envs.{kind}.{missing[0]} is missing (the env pool's limits for kind {kind!r})")
        out[kind] = KindLimits(int(section["concurrency"]), float(section["timeout_s"]))
    return out


class EnvPool:
    """Thread pools per env kind. Use as a context manager or call `close()`."""

    def __init__(self, limits: dict[str, KindLimits] | None = None, default: KindLimits | None = None) -> None:
        self.limits = dict(limits or {})
        self.default = default
        self._pools: dict[str, cf.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._quarantined: set[int] = set()
        self.metrics: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def _pool(self, kind: str) -> cf.ThreadPoolExecutor:
        with self._lock:
            if kind not in self._pools:
                lim = self.limit(kind)
                self._pools[kind] = cf.ThreadPoolExecutor(lim.concurrency, thread_name_prefix=f"env-{kind}")
            return self._pools[kind]

    def limit(self, kind: str) -> KindLimits:
        """The kind's limits (`default` for kinds not listed); a kind with neither is an error naming it."""
        lim = self.limits.get(kind, self.default)
        if lim is None:
            raise ValueError(f"env kind {kind!r} has no pool limits (config.envs.{kind}.concurrency / timeout_s)")
        return lim

    @staticmethod
    def kind_of(env: Any) -> str:
        return str(getattr(env, "kind", "sandbox"))

    def quarantined(self, env: Any) -> bool:
        return id(env) in self._quarantined

    def release(self, env: Any) -> None:
        """Forget an env (call when it is closed): its id may be reused by a new object."""
        self._quarantined.discard(id(env))

    def submit(self, env: Any, fn: Callable[[], Any]) -> cf.Future:
        """Run `fn()` on the env's kind pool; the future records latency in the kind's metrics and its
        start time in `future.started` (a one-item list, empty while the call waits for a worker)."""
        kind = self.kind_of(env)
        t_submit = time.perf_counter()
        started: list[float] = []

        def timed() -> Any:
            t0 = time.perf_counter()
            started.append(t0)
            try:
                return fn()
            finally:
                m = self.metrics[kind]
                m["calls"] += 1
                m["busy_ms"] += int((time.perf_counter() - t0) * 1000)
                m["wait_ms"] += int((t0 - t_submit) * 1000)

        fut = self._pool(kind).submit(timed)
        fut.started = started  # type: ignore[attr-defined]
        return fut

    def wait(self, env: Any, fut: cf.Future) -> Any:
        """fut's result; raises TimeoutError once the call has RUN longer than its kind's timeout
        (time queued behind the kind's concurrency limit does not count)."""
        timeout = self.limit(self.kind_of(env)).timeout_s
        while True:
            started = fut.started  # type: ignore[attr-defined]
            left = 0.02 if not started else started[0] + timeout - time.perf_counter()
            try:
                return fut.result(timeout=max(0.0, left))
            except cf.TimeoutError:
                if started and time.perf_counter() >= started[0] + timeout:
                    raise

    def step_all(self, pairs: Sequence[tuple[Any, Any]]) -> list[Feedback]:
        """Step every (env, action) concurrently; one Feedback per pair, in order (a bug in an env is raised)."""
        return self.call_all([(env, (lambda e=env, a=action: e.step(a)), getattr(action, "call_id", ""))
                              for env, action in pairs])

    def call_all(self, calls: Sequence[tuple[Any, Callable[[], Any], str]]) -> list[Any]:
        """Run (env, fn, call_id) calls concurrently with per-kind timeouts.

        A result is fn()'s value; an `envs.base.EnvFault` becomes INFRA Feedback; a timeout becomes TIMEOUT
        Feedback and quarantines the env; a quarantined env answers INFRA without running. Any other exception
        is a bug and is raised.
        """
        out: list[Any] = [None] * len(calls)
        futures: list[tuple[int, Any, str, cf.Future]] = []
        inline: list[tuple[int, Any, Callable[[], Any], str]] = []
        for i, (env, fn, call_id) in enumerate(calls):
            kind = self.kind_of(env)
            if self.quarantined(env):
                self.metrics[kind]["infra"] += 1
                out[i] = Feedback.error(ErrorCode.INFRA, "env quarantined after an earlier timeout", call_id)
            elif self.limit(kind).concurrency == 0:
                inline.append((i, env, fn, call_id))
            else:
                futures.append((i, env, call_id, self.submit(env, fn)))
        for i, env, fn, call_id in inline:  # while the pooled calls run
            m = self.metrics[self.kind_of(env)]
            t0 = time.perf_counter()
            try:
                out[i] = fn()
            except EnvFault as e:  # the env reports the world failed; any other exception is a bug and goes up
                m["infra"] += 1
                out[i] = Feedback.error(ErrorCode.INFRA, f"env raised {type(e).__name__}: {e}", call_id)
            else:
                if isinstance(out[i], Feedback) and out[i].is_infra:
                    m["infra"] += 1
            m["calls"] += 1
            m["busy_ms"] += int((time.perf_counter() - t0) * 1000)
        for i, env, call_id, fut in futures:
            kind = self.kind_of(env)
            try:
                out[i] = self.wait(env, fut)
            except cf.TimeoutError:
                self._quarantined.add(id(env))
                self.metrics[kind]["timeouts"] += 1
                out[i] = Feedback.error(ErrorCode.TIMEOUT, f"{kind} env call exceeded {self.limit(kind).timeout_s}s", call_id)
            except EnvFault as e:  # the world's fault, never the policy's (any other exception is a bug: raised)
                self.metrics[kind]["infra"] += 1
                out[i] = Feedback.error(ErrorCode.INFRA, f"env raised {type(e).__name__}: {e}", call_id)
            else:
                if isinstance(out[i], Feedback) and out[i].is_infra:
                    self.metrics[kind]["infra"] += 1
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind: calls, timeouts, infra answers, mean busy and queue-wait milliseconds."""
        res = {}
        for kind, m in sorted(self.metrics.items()):
            n = max(1, m["calls"])
            res[kind] = {"calls": m["calls"], "timeouts": m["timeouts"], "infra": m["infra"],
                         "mean_busy_ms": m["busy_ms"] / n, "mean_wait_ms": m["wait_ms"] / n}
        return res

    def close(self) -> None:
        """Stop the pools without waiting for abandoned (timed-out) calls."""
        for p in self._pools.values():
            p.shutdown(wait=False, cancel_futures=True)
        self._pools.clear()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
