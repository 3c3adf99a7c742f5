"""Graceful interrupts for training loops: SIGINT / SIGTERM ask for a save at the next step boundary.

TPU pods and spot GPUs send SIGTERM shortly before preemption; a user presses Ctrl-C. Either way the
loop should finish the step it is in, save a checkpoint, and exit with one line. A second signal exits
at once (the user means it).

    with Preemption() as pre:
        for step in ...:
            ...one step...
            if pre.requested:
                save(step); print(pre.message(step)); break

No jax: usable from any loop. Handlers are installed only in the main thread (Python's rule) and the
previous handlers come back on exit.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(SystemExit):
    """Raised by a loop that stopped for a signal after saving (its one line already printed).

    A SystemExit, so the `mpa` command exits with `code` (130, as a shell reports Ctrl-C) and no
    traceback, and every caller up the stack (the loop, experiments) stops too; a caller that wants to
    go on catches it. `step` is the step saved (None when the signal came before any was)."""

    def __init__(self, message: str, step: int | None, code: int = 130):
        super().__init__(code)
        self.message, self.step = message, step


class Preemption:
    """Context manager: `requested` turns true on the first SIGINT/SIGTERM; the second exits at once."""

    def __init__(self, signals: tuple[int, ...] = _SIGNALS, exit_code: int = 130, armed: bool = True):
        self._signals = signals
        self._exit_code = exit_code
        # Unarmed (start-up: loading data, restoring, nothing trained yet), a signal stops at once by raising
        # `Interrupted` where the program is: there is nothing to save. `arm()` before the first step.
        self._armed = armed
        self._previous: dict[int, Any] = {}
        self.signal_name: str | None = None
        self._event = threading.Event()

    @property
    def requested(self) -> bool:
        """True once a signal asked the loop to stop at its next step boundary."""
        return self._event.is_set()

    def request(self, name: str = "request") -> None:
        """Ask for a stop as a signal would (for callers that stop for their own reasons, and tests)."""
        self.signal_name = self.signal_name or name
        self._event.set()

    def arm(self) -> None:
        """From now on a first signal asks for a save at the next step boundary instead of stopping at once."""
        self._armed = True

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self._armed:
            self.signal_name = name
            line = f"interrupted ({name}) while starting, before any step: nothing to save"
            sys.stderr.write(f"\n{line}\n")
            sys.stderr.flush()
            raise Interrupted(line, None, self._exit_code)
        if self._event.is_set():
            # Second signal: the user does not want to wait for the save.
            sys.stderr.write(f"\n{name} again: exiting now without saving\n")
            sys.stderr.flush()
            os._exit(self._exit_code)
        self.signal_name = name
        self._event.set()
        sys.stderr.write(f"\n{name}: stopping at the next step boundary to save a checkpoint "
                         f"(send it again to exit at once)\n")
        sys.stderr.flush()

    def message(self, step: int, where: str = "") -> str:
        """The one line printed when the loop stopped for a signal."""
        at = f" in {where}" if where else ""
        return f"interrupted ({self.signal_name}): saved step {step}{at}; run the same command again to resume"

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            for s in self._signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
