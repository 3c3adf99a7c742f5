"""Progress of a long job: a rich bar on a terminal, plain periodic log lines everywhere else.

Under nohup, CI or a redirect a rich bar writes nothing useful (it redraws in place, and only at the
end), so there the job prints one plain line every `every_s` seconds, the first after `first_s`:

    sft: step 40/200 (20%)  1.9 step/s  ETA 1m24s  loss 2.3141

Start-up phases that can take a while (loading a checkpoint, building data, compiling) are named while
they run, with a heartbeat line every `every_s` seconds and their duration at the end, so a log is never
silent for long:

    prog = Progress("sft", total=200, start=0, section=config.progress)
    with prog.phase("compiling the train step"):
        ...
    for step in ...:
        prog.update(step + 1, loss=...)
    prog.close()

No jax: usable from any loop (SFT, RL, evaluation).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m: short and sortable by eye."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


class Progress:
    """Step progress of one job, shown as a rich bar on a TTY or as plain lines otherwise.

    `every_s` / `first_s` (config.progress) set the plain lines' period and how soon the first one comes;
    `tty` (default: `stream.isatty()`) picks the mode; `enabled=False` prints nothing (other processes
    of a multi-host job). `clock` is for tests.
    """

    def __init__(self, name: str, total: int, start: int = 0, *, unit: str = "step", every_s: float = 30.0,
                 first_s: float = 5.0, section: Any = None, stream: TextIO | None = None, tty: bool | None = None,
                 enabled: bool = True, clock: Callable[[], float] = time.monotonic):
        if section is not None:
            every_s, first_s = float(section.every_s), float(section.first_s)
        self.name, self.total, self.unit = name, int(total), unit
        self.every_s, self.first_s = float(every_s), float(first_s)
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stdout
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)()) if tty is None else tty
        self._clock = clock
        self._start = int(start)
        self._done = int(start)
        self._t0 = clock()
        # the rate counts from the first update on (start-up and compilation are not steps)
        self._rate_from: tuple[int, float] | None = None
        self._next_line = self._t0 + self.first_s
        self._last_printed = -1
        self._fields: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def set_start(self, start: int) -> None:
        """The step the loop starts from (known after a restore); the clock for the first line restarts."""
        self._start = self._done = int(start)
        self._t0 = self._clock()
        self._next_line = self._t0 + self.first_s

    # -- output

    def log(self, text: str) -> None:
        """One line of the job's log (through the bar's console on a TTY, so the bar stays intact)."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.console.print(text, markup=False, highlight=False)
            else:
                self._stream.write(text + "\n")
                self._stream.flush()

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """Name a start-up phase while it runs: a line at its start, a heartbeat every `every_s`, its duration at the end."""
        if not self.enabled:
            yield
            return
        t0 = self._clock()
        self.log(f"{self.name}: {what}...")
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(max(self.every_s, 1.0)):
                self.log(f"{self.name}: still {what} ({format_duration(self._clock() - t0)})")

        beater = threading.Thread(target=beat, name=f"progress-{self.name}", daemon=True)
        beater.start()
        try:
            yield
        finally:
            stop.set()
            beater.join()
        self.log(f"{self.name}: {what}: done in {format_duration(self._clock() - t0)}")

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """Plain mode: while the body runs, print the current line whenever `every_s` passed without one, so a
        slow first step (compiling inside it) or a long one still shows in the log. Nothing on a terminal."""
        if not self.enabled or self._tty:
            yield
            return
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(max(self.every_s, 1.0)):
                now = self._clock()
                if now >= self._next_line:
                    self.log(self.line(now))
                    self._next_line = now + self.every_s

        ticker = threading.Thread(target=tick, name=f"progress-{self.name}", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def update(self, done: int, **fields: Any) -> None:
        """`done` steps of `total` finished; `fields` (e.g. loss) are shown with the line and kept until replaced."""
        if not self.enabled:
            return
        now = self._clock()
        self._done = int(done)
        self._fields.update({k: v for k, v in fields.items() if v is not None})
        if self._rate_from is None:
            self._rate_from = (self._done, now)
        if self._tty:
            self._bar_update()
            return
        if now >= self._next_line or (self._done >= self.total and self._last_printed != self._done):
            self.log(self.line(now))
            self._last_printed = self._done
            self._next_line = now + self.every_s

    def rate(self, now: float | None = None) -> float | None:
        """Steps per second since the first update (None before two points exist)."""
        if self._rate_from is None:
            return None
        d0, t0 = self._rate_from
        now = self._clock() if now is None else now
        if self._done <= d0 or now <= t0:
            return None
        return (self._done - d0) / (now - t0)

    def line(self, now: float | None = None) -> str:
        """The plain progress line: step, percentage, rate, ETA and the fields."""
        now = self._clock() if now is None else now
        pct = 100.0 * self._done / self.total if self.total > 0 else 100.0
        parts = [f"{self.name}: {self.unit} {self._done}/{self.total} ({pct:.0f}%)"]
        rate = self.rate(now)
        if rate:
            parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}")
            parts.append(f"ETA {format_duration((self.total - self._done) / rate)}")
        else:
            parts.append(f"elapsed {format_duration(now - self._t0)}")
        parts += [f"{k} {_fmt(v)}" for k, v in self._fields.items()]
        return "  ".join(parts)

    # -- the terminal bar

    def _bar_update(self) -> None:
        if self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(TextColumn(self.name), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                     TimeRemainingColumn(), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.name, total=self.total, completed=self._start, info="")
        info = "  ".join(f"{k} {_fmt(v)}" for k, v in self._fields.items())
        self._bar.update(self._task, completed=self._done, info=info)

    def close(self) -> None:
        """Stop the bar (a TTY) or print the final line if the last one printed is not current (plain)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif not self._tty and self._rate_from is not None and self._last_printed != self._done:
            self.log(self.line())
            self._last_printed = self._done
