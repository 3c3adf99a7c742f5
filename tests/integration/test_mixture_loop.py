"""The agent loop steps a round's episodes concurrently through the EnvPool: slow envs overlap, a step
past its kind's timeout is TIMEOUT (the episode infra, not scored), and episodes run on the emulated
device through the REAL adb server like any other env."""
from __future__ import annotations

import threading
import time

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs import load_tasks, make_env
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.env import AdbEnv
from mpa_jax.envs.adb.server import AdbServer
from mpa_jax.envs.pool import EnvPool, KindLimits
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)


@pytest.fixture(scope="module")
def tasks():
    return [t for t in load_tasks("dev") if t.category == "tool_use" and not t.faults][:4]


def _script(tok, tasks):
    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.instruction in text)
        turn = text.count("<|im_start|>assistant") - 1
        g = task.gold[min(turn, len(task.gold) - 1)]
        return tk.format_tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else g["text"]

    return script


class SlowSandbox(SandboxEnv):
    """A sandbox whose tool steps take `delay` seconds (a slow device); kind "slow" for the pool.
    `active` / `peak` count tool steps in flight across all instances (how many overlapped)."""

    kind = "slow"
    lock = threading.Lock()
    active = 0
    peak = 0

    def __init__(self, delay: float) -> None:
        super().__init__(fault_injection=False)
        self.delay = delay

    def step(self, action):
        if action.kind == "tool_call":
            cls = type(self)
            with cls.lock:
                cls.active += 1
                cls.peak = max(cls.peak, cls.active)
            time.sleep(self.delay)
            with cls.lock:
                cls.active -= 1
        return super().step(action)


def test_round_steps_overlap_and_succeed(tok, tasks):
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=256, batch_size=4, seed=1)
    peaks = {}
    for concurrency in (4, 1):
        SlowSandbox.peak = 0
        with EnvPool({"slow": KindLimits(concurrency=concurrency, timeout_s=5.0)}) as pool:
            trajs = run_episodes(ScriptedEngine(tok, _script(tok, tasks)), tok, tasks, lambda: SlowSandbox(0.25), cfg, pool=pool)
        assert all(t.verification.success and not t.infra_failure for t in trajs)
        peaks[concurrency] = SlowSandbox.peak
    # Tool steps in flight at once (counted, not timed: a loaded host cannot fail it): the episodes of a
    # round overlap their slow steps, and a kind limited to 1 steps them one at a time.
    assert peaks[4] >= 2 and peaks[1] == 1, peaks


def test_step_timeout_is_an_infra_episode(tok, tasks):
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=256, batch_size=4, seed=1)
    envs = iter([SlowSandbox(2.0), SlowSandbox(0.0), SlowSandbox(0.0), SlowSandbox(0.0)])
    with EnvPool({"slow": KindLimits(concurrency=4, timeout_s=0.3)}) as pool:
        trajs = run_episodes(ScriptedEngine(tok, _script(tok, tasks)), tok, tasks, lambda: next(envs), cfg, pool=pool)
    assert trajs[0].infra_failure and trajs[0].verification.infra_error
    assert "TIMEOUT" in trajs[0].provenance["infra_reason"]
    assert all(t.verification.success for t in trajs[1:])


def test_agent_loop_on_the_emulated_device(tok, tasks):
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=256, batch_size=1, seed=1)
    with AdbServer() as srv, EmulatedDevice() as dev, EnvPool({"adb": KindLimits(1, 10.0)}) as pool:
        srv.connect(dev.serial)
        trajs = run_episodes(ScriptedEngine(tok, _script(tok, tasks)), tok, tasks[:2],
                             lambda: AdbEnv(dev.serial, adb_port=srv.port), cfg, pool=pool)
    assert all(t.verification.success and t.provenance["env"] == "adb" for t in trajs)
    local = run_episodes(ScriptedEngine(tok, _script(tok, tasks)), tok, tasks[:2], lambda: make_env("sandbox"), cfg)
    assert [t.tokens for t in trajs] == [t.tokens for t in local]
