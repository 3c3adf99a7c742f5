"""Per-row token streams for the server: what the app consumes, whichever batcher produced it.

`RowStream` is an async iterator of `(row, Update)` over the rows of one HTTP request (n choices, or
several prompts); it ends after every row's final update (the one with `result`) and raises the first
row error. `cancel(row)` asks the producer to stop that row early (a stop string was seen, or the client
went away).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from mpa_jax.rollout.types import Update


class RowStream:
    """Updates of `n_rows` rows, fed from any thread by `push(row, update)`."""

    def __init__(self, n_rows: int, cancel: Callable[[int], None] | None = None) -> None:
        self.n_rows = n_rows
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._open = n_rows
        self._cancel = cancel
        self.results: list[Any] = [None] * n_rows

    def push(self, row: int, update: Update) -> None:
        """Thread-safe: hand `update` of `row` to the consumer's event loop."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (row, update))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def cancel(self, row: int) -> None:
        if self._cancel is not None:
            self._cancel(row)

    def cancel_all(self) -> None:
        for row in range(self.n_rows):
            if self.results[row] is None:
                self.cancel(row)

    def __aiter__(self) -> "RowStream":
        return self

    async def __anext__(self) -> tuple[int, Update]:
        if self._open == 0:
            raise StopAsyncIteration
        row, update = await self._queue.get()
        if update.error is not None:
            self.cancel_all()
            raise update.error
        if update.result is not None:
            self.results[row] = update.result
            self._open -= 1
        return row, update

    async def collect(self) -> list[Any]:
        """Drain the stream; the final results in row order."""
        async for _ in self:
            pass
        return list(self.results)
