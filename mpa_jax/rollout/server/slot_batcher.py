"""Admission per decode chunk: the server's rows are the embedded engine's slots (`Engine.submit`).

Same interface as `Batcher` (`submit`, `stream_rows`, `lock`, `busy`, `wait_idle`, `calls`, `rows`), but
a request joins the running batch at the next chunk boundary (a few decode steps) instead of waiting
for a whole engine call, and its tokens are delivered as they are decoded (streaming). The engine is
the one the agent loop uses; the server only sizes its slots (`config.serve.max_batch`, `slot_len`,
`slot_chunk`).
"""
from __future__ import annotations

import asyncio
from typing import Any

from mpa_jax.rollout.server.streams import RowStream
from mpa_jax.rollout.types import GenerateResult, SamplingParams


class SlotBatcher:
    """Requests -> `engine.submit` (the embedded `Engine`, any model family)."""

    kind = "slots"

    def __init__(self, engine: Any, max_batch: int, *, max_len: int = 1024, chunk: int = 8) -> None:
        self.engine = engine
        engine.configure_slots(slots=max_batch, slot_len=max_len, chunk=chunk)
        self.max_batch = engine.slots
        self.lock = asyncio.Lock()  # held during weight updates (the engine swaps weights between chunks anyway)
        self.rows = 0
        self._calls0 = engine.stats().get("prefills", 0.0)

    @property
    def calls(self) -> int:
        """Prefill calls (admissions of waiting requests into free slots) since this batcher started."""
        return int(self.engine.stats().get("prefills", 0.0) - self._calls0)

    @property
    def busy(self) -> bool:
        return self.engine.busy

    @property
    def supports_top_logprobs(self) -> bool:
        return True

    async def wait_idle(self) -> None:
        while self.engine.busy:
            await asyncio.sleep(0.01)

    def close(self) -> None:
        """Nothing of the server's to stop: the engine's loop thread ends by itself when idle."""

    def stream_rows(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], seeds: list[int],
                    top_logprobs: int = 0, updates: bool = True) -> RowStream:
        """Start generating `prompts` (one setting, or one per prompt); their updates as they are decoded
        (`updates=False`: only each row's final update, for consumers that need the result alone)."""
        rows = list(params) if isinstance(params, list) else [params] * len(prompts)
        futures: list[Any] = []

        def cancel(i: int) -> None:
            # stop(), not Future.cancel(): a stopped request still sends its final update (the tokens so
            # far), which the stream's consumer may be waiting for.
            if i < len(futures):
                futures[i].stop()

        stream = RowStream(len(prompts), cancel)
        # One group: a request's n choices reach the slots together.
        futures.extend(self.engine.submit_many(prompts, rows, [int(s) for s in seeds], top_logprobs=int(top_logprobs),
                                               on_update=[lambda u, i=i: stream.push(i, u) for i in range(len(prompts))],
                                               updates=updates))
        self.rows += len(futures)
        return stream

    async def submit(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], seeds: list[int],
                     top_logprobs: int = 0) -> list[GenerateResult]:
        """Generate for `prompts`; the final results in order."""
        stream = self.stream_rows(prompts, params, seeds, top_logprobs, updates=False)
        try:
            return await stream.collect()
        except asyncio.CancelledError:
            stream.cancel_all()
            raise
