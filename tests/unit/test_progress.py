"""Progress: plain periodic lines (step, rate, ETA) when the stream is not a terminal, named phases."""
import io
import threading

from mpa_jax.train.progress import Progress, format_duration


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class _Watched(io.StringIO):
    """A log stream that sets `seen` once a line containing `text` is written (a wait, not a sleep)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.text in s:
            self.seen.set()
        return n


def test_plain_lines_come_first_after_first_s_then_every_every_s_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    p = Progress("sft", total=100, every_s=10.0, first_s=2.0, stream=out, clock=clock)
    clock.t += 1.0
    p.update(1, loss=5.0)  # 1 s in: before first_s, nothing yet
    assert out.getvalue() == ""
    clock.t += 1.5
    p.update(4, loss=4.5)  # 2.5 s in: the first line, 3 steps in 1.5 s since the first update
    lines = out.getvalue().splitlines()
    assert lines == ["sft: step 4/100 (4%)  2 step/s  ETA 48s  loss 4.5000"]
    for step in range(5, 25):  # one step per 0.5 s: the next line 10 s after the first
        clock.t += 0.5
        p.update(step)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("sft: step 24/100 (24%)  2 step/s  ETA 38s  loss 4.5000")
    clock.t += 0.5
    p.update(100)  # the last step always prints
    assert out.getvalue().splitlines()[-1].startswith("sft: step 100/100 (100%)")
    p.close()  # nothing new to say
    assert len(out.getvalue().splitlines()) == 3
    assert "\r" not in out.getvalue()  # a StringIO is not a terminal: plain lines, no redraws


def test_slow_steps_show_seconds_per_step_and_close_prints_the_last_state():
    out, clock = io.StringIO(), Clock()
    p = Progress("eval", total=10, unit="episode", every_s=60.0, first_s=0.0, stream=out, clock=clock)
    p.update(1)
    clock.t += 20.0
    p.update(2, success=1)
    p.close()
    assert out.getvalue().splitlines()[-1] == "eval: episode 2/10 (20%)  20 s/episode  ETA 2m40s  success 1"


def test_phase_names_itself_while_it_runs_and_reports_its_duration():
    out = _Watched("still compiling")
    p = Progress("sft", total=5, every_s=1.0, first_s=0.0, stream=out)
    with p.phase("compiling the train step"):
        assert out.seen.wait(60), "no heartbeat"  # the phase lasts until its heartbeat is written
    lines = out.getvalue().splitlines()
    assert lines[0] == "sft: compiling the train step..."
    assert lines[1].startswith("sft: still compiling the train step (")
    assert lines[-1].startswith("sft: compiling the train step: done in ")


def test_disabled_prints_nothing_and_durations_format():
    out = io.StringIO()
    p = Progress("sft", total=3, first_s=0.0, stream=out, enabled=False)
    with p.phase("x"):
        p.update(3)
    p.log("hello")
    p.close()
    assert out.getvalue() == ""
    assert [format_duration(s) for s in (4.4, 65, 7325)] == ["4s", "1m05s", "2h02m"]


def test_ticking_prints_the_current_line_while_nothing_finishes():
    """A first step that compiles for a while: the log still gets a line every `every_s` (plain mode)."""
    out = _Watched("eval: episode 0/4")
    p = Progress("eval", total=4, unit="episode", every_s=1.0, first_s=0.0, stream=out)
    with p.ticking():
        assert out.seen.wait(60), "no tick"  # nothing finishes until the ticker has written its line
    lines = out.getvalue().splitlines()
    assert lines and lines[0].startswith("eval: episode 0/4 (0%)  elapsed ")
    tty = io.StringIO()
    q = Progress("eval", total=4, every_s=1.0, first_s=0.0, stream=tty, tty=True)
    with q.ticking():
        ticker = [t for t in threading.enumerate() if t.name == "progress-eval"]
    assert ticker == [] and tty.getvalue() == ""  # a terminal has its bar instead: no ticker runs
