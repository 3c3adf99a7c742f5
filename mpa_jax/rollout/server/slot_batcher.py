"""Admission per decode chunk: the server's rows are the slots of a `SlotLoop` (`mpa_jax.rollout.slots`).

Same interface as `Batcher` (`submit`, `stream_rows`, `lock`, `busy`, `wait_idle`, `calls`, `rows`), but
a request joins the running batch at the next chunk boundary (a few decode steps) instead of waiting
for a whole engine call, and its tokens are delivered as they are decoded (streaming).
"""
from __future__ import annotations

import asyncio
from typing import Any

from mpa_jax.rollout.server.streams import RowStream
from mpa_jax.rollout.slots import SlotDecoder, SlotLoop, SlotRequest
from mpa_jax.rollout.types import GenerateResult, SamplingParams


class SlotBatcher:
    """Requests -> slot requests on a `SlotLoop` over `engine` (a JaxEngine the slot loop supports)."""

    kind = "slots"

    def __init__(self, engine: Any, max_batch: int, *, max_len: int = 1024, chunk: int = 8) -> None:
        self.engine = engine
        self.decoder = SlotDecoder(engine, slots=max_batch, max_len=max_len, chunk=chunk)
        self.loop = SlotLoop(self.decoder)
        self.max_batch = self.decoder.slots
        self.lock = asyncio.Lock()  # held during weight updates (the loop picks new weights up between chunks)
        self.rows = 0

    @property
    def calls(self) -> int:
        """Prefill calls (admissions of waiting requests into free slots)."""
        return self.decoder.prefills

    @property
    def busy(self) -> bool:
        return not self.loop.idle

    @property
    def supports_top_logprobs(self) -> bool:
        return True

    async def wait_idle(self) -> None:
        while not self.loop.idle:
            await asyncio.sleep(0.01)

    def close(self) -> None:
        self.loop.close()

    def stream_rows(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], seeds: list[int],
                    top_logprobs: int = 0, updates: bool = True) -> RowStream:
        """Start generating `prompts` (one setting, or one per prompt); their updates as they are decoded
        (`updates=False`: only each row's final update, for consumers that need the result alone)."""
        rows = list(params) if isinstance(params, list) else [params] * len(prompts)
        reqs: list[SlotRequest] = []

        def cancel(i: int) -> None:
            reqs[i].cancelled = True

        stream = RowStream(len(prompts), cancel)
        for i, (p, sp, seed) in enumerate(zip(prompts, rows, seeds)):
            reqs.append(SlotRequest(list(map(int, p)), sp, int(seed), int(top_logprobs),
                                    on_update=lambda u, i=i: stream.push(i, u), updates=updates))
        for r in reqs:
            self.loop.submit(r)
        self.rows += len(reqs)
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
