"""The per-kind worker pool (concurrency limits, timeouts -> TIMEOUT Feedback) and the hybrid mixture
across sandbox, simulated and device envs (the device: the emulated one behind the REAL adb server).

The pool's properties are checked by counted events, never by elapsed seconds: a fake env counts its steps
in flight, and gates it holds until the test opens them show which calls overlapped or were left behind."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.config import load_config_file
from mpa_jax.envs import Action, ErrorCode, Feedback, SandboxEnv, Task, load_tasks, make_env
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.adb.server import AdbServer
from mpa_jax.envs.mixture import MixtureSampler
from mpa_jax.envs.pool import EnvPool, KindLimits, limits_from_config
from mpa_jax.envs.simulated import run_gold, simulated_tasks
from mpa_jax.rollout.runner import EpisodeConfig, EpisodeRunner
from mpa_jax.rollout.testing import ScriptedEngine


SAFETY_S = 5.0  # a gate that is never opened gives up after this (so a broken pool fails instead of hanging)


class _Gauge:
    """Counts a fake env's steps across threads: entered, in flight now, the most in flight at once, finished."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entered = self.now = self.max = self.done = 0

    def wait_for(self, pred) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, SAFETY_S)


class _SlowEnv:
    """A stand-in env (a slow device) whose step is counted by a shared _Gauge.

    `meet=n`: the step holds until n steps are in flight at once (or every one of `total` has entered), so a
    pool that allows n concurrent calls is seen to run n; `gate`: the step holds until the test opens it;
    `hold_s`: a further sleep, only to give a pool that breaks its limit the chance to show it.
    """

    kind = "slow"

    def __init__(self, gauge: _Gauge, *, meet: int = 0, total: int = 0, gate: threading.Event | None = None,
                 hold_s: float = 0.0) -> None:
        self.gauge, self.meet, self.total, self.gate, self.hold_s = gauge, meet, total, gate, hold_s

    def step(self, action):
        g = self.gauge
        with g.cond:
            g.entered += 1
            g.now += 1
            g.max = max(g.max, g.now)
            g.cond.notify_all()
        if self.meet:
            g.wait_for(lambda: g.now >= self.meet or g.entered == self.total)
        if self.gate is not None:
            self.gate.wait(SAFETY_S)
        time.sleep(self.hold_s)
        with g.cond:
            g.now -= 1
            g.done += 1
            g.cond.notify_all()
        return Feedback(call_id=action.call_id, status="ok", result={})


def test_pool_limits_concurrency_per_kind():
    g = _Gauge()
    with EnvPool({"slow": KindLimits(concurrency=2, timeout_s=30.0)}) as pool:
        fbs = pool.step_all([(_SlowEnv(g, meet=2, total=6, hold_s=0.05), Action.finish()) for _ in range(6)])
    # every step met a second one in flight (the limit is used) and no third ever entered (the limit holds)
    assert all(fb.ok for fb in fbs) and g.done == 6 and g.max == 2


def test_timeout_is_timeout_feedback_and_quarantines_the_env():
    g, gate = _Gauge(), threading.Event()
    slow, fast = _SlowEnv(g, gate=gate), _SlowEnv(_Gauge())
    try:
        with EnvPool({"slow": KindLimits(concurrency=4, timeout_s=0.3)}) as pool:
            a, b = pool.step_all([(slow, Action.tool_call("x", {}, call_id="c1")), (fast, Action.finish())])
            # step_all answered while the slow step was still held at its gate: it did not wait for it
            assert (g.entered, g.done) == (1, 0)
            assert a.error_code == ErrorCode.TIMEOUT and a.call_id == "c1" and b.ok
            again = pool.step_all([(slow, Action.finish())])[0]
            assert again.error_code == ErrorCode.INFRA and "quarantined" in again.message
            assert g.entered == 1  # the quarantined env answered without being stepped again
            gate.set()  # the abandoned call ends; its env stays quarantined
            assert g.wait_for(lambda: g.done == 1)
            assert pool.step_all([(slow, Action.finish())])[0].error_code == ErrorCode.INFRA and g.entered == 1
            assert pool.summary()["slow"]["timeouts"] == 1
    finally:
        gate.set()


def test_queue_time_behind_the_limit_does_not_count_as_timeout():
    g = _Gauge()
    with EnvPool({"slow": KindLimits(concurrency=1, timeout_s=1.0)}) as pool:
        fbs = pool.step_all([(_SlowEnv(g, hold_s=0.1), Action.finish()) for _ in range(12)])
    # one at a time (max 1) and each step held >= 0.1 s, so the last waited >= 1.1 s in the queue, past the
    # 1.0 s timeout, while none ran for long: no call may answer TIMEOUT
    assert g.max == 1 and g.done == 12
    assert all(fb.ok for fb in fbs) and pool.summary()["slow"]["timeouts"] == 0


def test_a_slow_kind_does_not_hold_up_another():
    g, gate = _Gauge(), threading.Event()
    sandbox_tasks = [t for t in load_tasks("dev") if not t.faults][:8]
    try:
        with EnvPool({"slow": KindLimits(1, 30.0), "sandbox": KindLimits(8, 30.0)}) as pool:
            stuck = _SlowEnv(g, gate=gate)
            slow = pool.submit(stuck, lambda: stuck.step(Action.finish()))
            assert g.wait_for(lambda: g.now == 1)  # the slow kind's one worker is busy until the gate opens
            envs = [SandboxEnv() for _ in sandbox_tasks]
            pool.call_all([(e, (lambda e=e, t=t: e.reset(t)), "") for e, t in zip(envs, sandbox_tasks)])
            fbs = pool.step_all([(e, Action.finish()) for e in envs])
            # every sandbox call answered while the slow call was still held at its gate
            assert all(fb.ok for fb in fbs) and not slow.done() and (g.now, g.done) == (1, 0)
            assert pool.summary()["sandbox"]["calls"] == 16
            gate.set()
            assert slow.result(timeout=SAFETY_S).ok
    finally:
        gate.set()


def test_inline_kind_runs_in_the_caller_while_pooled_kinds_run():
    g, gate = _Gauge(), threading.Event()
    seen = {}

    class InlineSandbox(SandboxEnv):
        """The inline kind: records its thread and that the pooled step is in flight, then opens its gate."""

        def step(self, action):
            seen["thread"] = threading.get_ident()
            seen["overlap"] = g.wait_for(lambda: g.now == 1)  # the pooled step is in flight right now
            gate.set()
            return super().step(action)

    try:
        with EnvPool({"slow": KindLimits(4, 30.0), "sandbox": KindLimits(0, 30.0)}) as pool:
            env = InlineSandbox()
            env.reset(load_tasks("dev")[0])
            fbs = pool.step_all([(_SlowEnv(g, gate=gate), Action.finish()), (env, Action.finish())])
            # the pooled step could only finish once the inline step opened its gate: the two overlapped
            assert all(fb.ok for fb in fbs) and seen["overlap"] and g.done == 1
            assert seen["thread"] == threading.get_ident()  # inline = in the caller's thread
            assert pool.summary()["sandbox"]["calls"] == 1
    finally:
        gate.set()


@pytest.mark.parametrize("concurrency", [0, 1])
def test_env_faults_become_infra_and_env_bugs_raise(concurrency):
    """Issue 55: what an env reports as a world fault (`EnvFault`) is INFRA Feedback; any other exception is a
    bug and reaches the caller (inline or from a worker thread)."""
    class Broken:
        kind = "sandbox"

        def __init__(self, exc):
            self.exc = exc

        def step(self, action):
            raise self.exc

    with EnvPool({"sandbox": KindLimits(concurrency, 30.0)}) as pool:
        fb = pool.step_all([(Broken(EnvFault("device lost")), Action.finish())])[0]
        assert fb.error_code == ErrorCode.INFRA and "device lost" in fb.message
        assert pool.summary()["sandbox"]["infra"] == 1
        with pytest.raises(ZeroDivisionError):
            pool.step_all([(Broken(ZeroDivisionError("a bug")), Action.finish())])


def test_config_envs_section_reaches_make_env_and_the_pool():
    c = load_config_file("configs/tiny.py")
    lim = limits_from_config(c)
    assert lim["adb"] == KindLimits(1, 60.0) and lim["sandbox"].concurrency == 0 and set(lim) == {"sandbox", "simulated", "adb", "bfcl", "agentdojo"}
    del c.envs.adb["concurrency"]
    with pytest.raises(ValueError, match=r"config.envs.adb.concurrency is missing"):
        limits_from_config(c)  # configs/ is the one source of the pool's limits
    with pytest.raises(ValueError, match="env kind 'slow' has no pool limits"):
        EnvPool(lim).limit("slow")
    assert isinstance(make_env("sandbox", config=c), SandboxEnv)
    with pytest.raises(ValueError, match="config.envs.adb"):
        make_env("adb", config=c)  # no device serial configured


def test_sampler_follows_the_weights():
    tasks = {"sandbox": load_tasks("dev")[:20], "simulated": simulated_tasks(10)}
    draws = MixtureSampler({"sandbox": 3.0, "simulated": 1.0, "adb": 0.0}, tasks, seed=0).sample(2000)
    share = sum(k == "sandbox" for k, _ in draws) / len(draws)
    assert 0.71 < share < 0.79
    assert {t.id for k, t in draws if k == "simulated"} == {t.id for t in tasks["simulated"]}  # cycles through all
    with pytest.raises(ValueError, match="config.envs.mixture.adb"):
        MixtureSampler({"sandbox": 1.0, "adb": 1.0}, tasks)
    with pytest.raises(ValueError, match="config.envs.mixture.phone: unknown env kind"):
        MixtureSampler({"phone": 1.0}, tasks)


def test_mixture_runs_all_three_kinds_with_per_kind_metrics():
    sandbox = make_env("sandbox")
    gold_ok = [t for t in load_tasks("dev") if not t.faults and not t.roles and t.category == "tool_use"]
    sb_tasks = []
    for t in gold_ok:
        sandbox.reset(t)
        for i in range(len(t.gold)):
            sandbox.step(gold_policy("sandbox", t, i, None))
        if sandbox.verify().success:
            sb_tasks.append(t)
        if len(sb_tasks) == 12:
            break
    sim_tasks = simulated_tasks(12, seed=5)
    assert all(run_gold(make_env("simulated"), t).success for t in sim_tasks[:3])
    with AdbServer() as srv, EmulatedDevice() as dev:
        srv.connect(dev.serial)
        c = load_config_file("configs/tiny.py")
        c.envs.mixture.simulated, c.envs.mixture.adb = 1.0, 1.0
        c.envs.adb.device, c.envs.adb.adb_port = dev.serial, srv.port
        draws = MixtureSampler.from_config(c, {"sandbox": sb_tasks, "simulated": sim_tasks, "adb": sb_tasks}).sample(30)
        kinds = {k for k, _ in draws}
        assert kinds == {"sandbox", "simulated", "adb"}
        tok = tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)
        engine = ScriptedEngine(tok, _gold_script(tok, sb_tasks + sim_tasks))
        # the one runner: per-kind pool limits and live caps (one episode per device) from the config
        with EpisodeRunner.from_config(c, harness=False) as runner:
            trajs = runner.run(engine, tok, [t for _, t in draws], EpisodeConfig.defaults(max_turns=16, max_new_tokens=256, batch_size=8),
                               kinds=[k for k, _ in draws])
            pool = runner.pool.summary()
    assert set(pool) == kinds and all(pool[k]["calls"] > 0 for k in kinds)
    for (kind, task), traj in zip(draws, trajs):
        assert traj.provenance["env"] == kind and traj.task_id == task.id
        assert not traj.infra_failure and traj.finish_reason == "answer" and traj.verification.success, (kind, task.id, traj.finish_reason)
        assert traj.costs["tool_calls"] == sum(g["kind"] == "tool_call" for g in task.gold)


def _gold_script(tok, tasks: Sequence[Task]) -> Callable[[list[int], int], str]:
    """The model's turns for the runner: each task's gold actions, one per turn (the task is found by its
    instruction in the prompt; the turn by the assistant turns after it)."""

    def script(prompt: list[int], _i: int) -> str:
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.instruction in text)
        turn = text[text.rindex(task.instruction):].count("<|im_start|>assistant") - 1
        g = task.gold[min(turn, len(task.gold) - 1)]
        return tk.format_tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else g["text"]

    return script


def gold_policy(kind: str, task: Task, turn: int, last: Any) -> Action | None:
    """Replays a task's gold actions in order (used to pick tasks whose gold passes); None after the last one."""
    if turn >= len(task.gold):
        return None
    g = task.gold[turn]
    if g["kind"] == "tool_call":
        return Action.tool_call(g["name"], g.get("arguments", {}), call_id=f"call_{turn}")
    if g["kind"] == "message":
        return Action.message(g["text"])
    if g["kind"] == "delegate":
        return Action.delegate(g.get("name") or g.get("agent", ""), g.get("text") or g.get("instruction", ""))
    return Action.finish()
