"""Continuous admission of concurrent requests into engine calls.

One worker task runs engine calls back to back. Every request that arrives while a call runs waits
in a FIFO queue and is admitted into the *next* call, whatever its sampling settings (engines with
`generate_rows` take per-row settings; others are called once per distinct setting), up to
`max_batch` rows per call. A lone request on an idle server waits `gather_s` for company first.
The engine runs in a worker thread, so the event loop keeps accepting requests meanwhile.

Admission is per engine call, not per decode step: a request arriving mid-call starts when that
call returns (the embedded engine's decode loop is one compiled program), and a stream's tokens come
when the call returns. The server uses it for engines the slot loop does not support
(`server.slot_batcher.SlotBatcher` admits per decode chunk) and when `batcher="call"` is asked for.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from mpa_jax.rollout.server.streams import RowStream
from mpa_jax.rollout.types import Update
from mpa_jax.rollout.types import GenerateResult, RolloutEngine, SamplingParams


@dataclasses.dataclass
class _Request:
    prompts: list[list[int]]
    params: list[SamplingParams]
    seeds: list[int]
    top_logprobs: int
    future: asyncio.Future


class Batcher:
    """Merges concurrent generate requests into engine calls; the engine is used by one thread at a time."""

    kind = "call"

    def __init__(self, engine: RolloutEngine, max_batch: int, gather_s: float = 0.002) -> None:
        self.engine = engine
        self.max_batch = max(1, int(max_batch))
        self.gather_s = gather_s
        self.lock = asyncio.Lock()  # held during every engine call and weight update
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.in_flight = 0
        self.calls = 0  # engine calls made (tests and the bench read it)
        self.rows = 0  # rows generated

    @property
    def busy(self) -> bool:
        return bool(self._pending) or self.in_flight > 0

    @property
    def supports_top_logprobs(self) -> bool:
        return hasattr(self.engine, "generate_rows")

    async def wait_idle(self) -> None:
        """Wait until queued and running engine calls are done (their clients may have gone)."""
        if self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})

    async def submit(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        seeds: list[int],
        top_logprobs: int = 0,
    ) -> list[GenerateResult]:
        """Generate for `prompts` (one setting, or one per prompt) in the next engine call."""
        rows = list(params) if isinstance(params, list) else [params] * len(prompts)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(prompts, rows, list(seeds), int(top_logprobs), fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    def stream_rows(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        seeds: list[int],
        top_logprobs: int = 0,
        updates: bool = True,
    ) -> RowStream:
        """`submit` as a `RowStream`: once the engine call returns, one update per token, then the result
        (`updates=False`: the result alone)."""
        stream = RowStream(len(prompts))

        async def feed() -> None:
            try:
                results = await self.submit(prompts, params, seeds, top_logprobs)
            except Exception as e:  # noqa: BLE001 - the consumer raises it
                stream.push(0, Update([], [], error=e))
                return
            for i, r in enumerate(results):
                if not updates:
                    stream.push(i, Update(r.token_ids, r.logprobs, r.top_logprobs, result=r))
                    continue
                tops = r.top_logprobs or []
                for k, (t, lp) in enumerate(zip(r.token_ids[:-1], r.logprobs[:-1])):
                    stream.push(i, Update([t], [lp], [tops[k]] if k < len(tops) else None))
                k = max(len(r.token_ids) - 1, 0)
                stream.push(i, Update(r.token_ids[k:], r.logprobs[k:], tops[k:] or None, result=r))

        stream.task = asyncio.create_task(feed())  # type: ignore[attr-defined]  # kept alive by the stream
        return stream

    def close(self) -> None:
        """Nothing to stop (the worker task ends with the event loop)."""

    def _admit(self) -> list[_Request]:
        """The FIFO head of the queue, up to max_batch rows (a larger single request goes alone)."""
        group = [self._pending.pop(0)]
        n = len(group[0].prompts)
        while self._pending and n + len(self._pending[0].prompts) <= self.max_batch:
            req = self._pending.pop(0)
            group.append(req)
            n += len(req.prompts)
        return group

    async def _drain(self) -> None:
        await asyncio.sleep(self.gather_s)  # an idle server lets requests that arrive together merge
        while self._pending:
            group = self._admit()
            prompts = [p for g in group for p in g.prompts]
            params = [p for g in group for p in g.params]
            seeds = [s for g in group for s in g.seeds]
            top = max(g.top_logprobs for g in group)
            self.in_flight += 1
            try:
                async with self.lock:
                    results = await asyncio.to_thread(self._call, prompts, params, seeds, top)
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request
                for g in group:
                    if not g.future.done():
                        g.future.set_exception(e)
                continue
            finally:
                self.in_flight -= 1
            self.calls += 1
            self.rows += len(prompts)
            pos = 0
            for g in group:
                k = len(g.prompts)
                if not g.future.done():
                    g.future.set_result(results[pos : pos + k])
                pos += k

    def _call(self, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int], top: int) -> list[GenerateResult]:
        rows = getattr(self.engine, "generate_rows", None)
        if rows is not None:
            return rows(prompts, params, seeds, top) if top else rows(prompts, params, seeds)
        # A plain RolloutEngine: one call per distinct setting, results put back in order.
        out: list[Any] = [None] * len(prompts)
        groups: dict[SamplingParams, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault(p, []).append(i)
        for p, idx in groups.items():
            for i, r in zip(idx, self.engine.generate([prompts[i] for i in idx], p, [seeds[i] for i in idx])):
                out[i] = r
        return out
