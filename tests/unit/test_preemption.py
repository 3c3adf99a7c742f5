"""Preemption: while starting a signal stops at once (Interrupted, code 130); armed, the first signal only
asks for a stop at the next step boundary; a second one exits the process at once; handlers come back."""
import os
import signal
import subprocess
import sys

import pytest

from mpa_jax.train.preemption import Interrupted, Preemption


def test_unarmed_signal_raises_interrupted_with_code_130(capsys):
    with pytest.raises(Interrupted) as info:
        with Preemption(armed=False):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs between bytecodes of the main thread
                pass
    assert info.value.code == 130 and info.value.step is None
    assert "interrupted (SIGTERM) while starting" in capsys.readouterr().err


def test_armed_signal_requests_a_stop_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGINT)
    with Preemption() as pre:
        assert not pre.requested
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass
        assert pre.requested and pre.signal_name == "SIGINT"
        assert pre.message(7, "runs/x/checkpoints") == (
            "interrupted (SIGINT): saved step 7 in runs/x/checkpoints; run the same command again to resume")
    assert signal.getsignal(signal.SIGINT) is before


def test_second_signal_exits_at_once():
    code = ("import os, signal\nfrom mpa_jax.train.preemption import Preemption\n"
            "with Preemption() as pre:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    for _ in range(100000): pass\n"
            "print('not reached')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 130 and "not reached" not in res.stdout
    assert "SIGTERM again: exiting now without saving" in res.stderr
