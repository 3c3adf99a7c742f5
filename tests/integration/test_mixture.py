"""The per-kind worker pool (concurrency limits, timeouts -> TIMEOUT Feedback) and the hybrid mixture
across sandbox, simulated and device envs (the device: the emulated one behind the REAL adb server)."""
from __future__ import annotations

import threading
import time

import pytest

from mpa_jax.config import load_config_file
from mpa_jax.envs import Action, ErrorCode, Feedback, SandboxEnv, load_tasks, make_env
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.server import AdbServer
from mpa_jax.envs.mixture import MixtureSampler, gold_policy, run_round_robin
from mpa_jax.envs.pool import EnvPool, KindLimits, limits_from_config
from mpa_jax.envs.simulated import run_gold, simulated_tasks


class _SlowEnv:
    """A stand-in env whose step sleeps (a slow device); counts how many steps run at once."""

    kind = "slow"

    def __init__(self, delay: float, gauge: dict) -> None:
        self.delay, self.gauge = delay, gauge

    def step(self, action):
        with self.gauge["lock"]:
            self.gauge["now"] += 1
            self.gauge["max"] = max(self.gauge["max"], self.gauge["now"])
        time.sleep(self.delay)
        with self.gauge["lock"]:
            self.gauge["now"] -= 1
        return Feedback(call_id=action.call_id, status="ok", result={"slept": self.delay})


def _gauge():
    return {"lock": threading.Lock(), "now": 0, "max": 0}


def test_pool_limits_concurrency_per_kind():
    g = _gauge()
    with EnvPool({"slow": KindLimits(concurrency=2, timeout_s=5.0)}) as pool:
        fbs = pool.step_all([(_SlowEnv(0.05, g), Action.finish()) for _ in range(6)])
    assert all(fb.ok for fb in fbs) and g["max"] == 2


def test_timeout_is_timeout_feedback_and_quarantines_the_env():
    g = _gauge()
    slow, fast = _SlowEnv(1.0, g), _SlowEnv(0.0, g)
    with EnvPool({"slow": KindLimits(concurrency=4, timeout_s=0.2)}) as pool:
        t0 = time.perf_counter()
        a, b = pool.step_all([(slow, Action.tool_call("x", {}, call_id="c1")), (fast, Action.finish())])
        assert time.perf_counter() - t0 < 0.9
        assert a.error_code == ErrorCode.TIMEOUT and a.call_id == "c1" and b.ok
        again = pool.step_all([(slow, Action.finish())])[0]
        assert again.error_code == ErrorCode.INFRA and "quarantined" in again.message
        assert pool.summary()["slow"]["timeouts"] == 1


def test_queue_time_behind_the_limit_does_not_count_as_timeout():
    g = _gauge()
    with EnvPool({"slow": KindLimits(concurrency=1, timeout_s=0.3)}) as pool:
        fbs = pool.step_all([(_SlowEnv(0.1, g), Action.finish()) for _ in range(5)])  # 0.5 s queued in all
    assert all(fb.ok for fb in fbs)


def test_a_slow_kind_does_not_hold_up_another():
    g = _gauge()
    sandbox_tasks = [t for t in load_tasks("dev") if not t.faults][:8]
    with EnvPool({"slow": KindLimits(1, 10.0), "sandbox": KindLimits(8, 10.0)}) as pool:
        slow = pool.submit(_SlowEnv(0.6, g), lambda: time.sleep(0.6))
        envs = [SandboxEnv() for _ in sandbox_tasks]
        t0 = time.perf_counter()
        pool.call_all([(e, (lambda e=e, t=t: e.reset(t)), "") for e, t in zip(envs, sandbox_tasks)])
        fbs = pool.step_all([(e, Action.finish()) for e in envs])
        assert time.perf_counter() - t0 < 0.5 and not slow.done()
        assert all(fb.ok for fb in fbs)
        slow.result()


def test_inline_kind_runs_in_the_caller_while_pooled_kinds_run():
    g = _gauge()
    with EnvPool({"slow": KindLimits(4, 5.0), "sandbox": KindLimits(0, 5.0)}) as pool:
        env = SandboxEnv()
        env.reset(load_tasks("dev")[0])
        t0 = time.perf_counter()
        fbs = pool.step_all([(_SlowEnv(0.3, g), Action.finish()), (env, Action.finish())])
        assert all(fb.ok for fb in fbs) and time.perf_counter() - t0 < 0.55
        assert pool.summary()["sandbox"]["calls"] == 1


def test_env_exceptions_become_infra():
    class Broken:
        kind = "sandbox"

        def step(self, action):
            raise RuntimeError("boom")

    with EnvPool() as pool:
        fb = pool.step_all([(Broken(), Action.finish())])[0]
    assert fb.error_code == ErrorCode.INFRA and "boom" in fb.message


def test_config_envs_section_reaches_make_env_and_the_pool():
    c = load_config_file("configs/tiny.py")
    lim = limits_from_config(c)
    assert lim["adb"] == KindLimits(1, 60.0) and lim["sandbox"].concurrency == 0 and "mixture" not in lim
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
        with EnvPool(limits_from_config(c)) as pool:
            out = run_round_robin(draws, lambda kind: make_env(kind, config=c), gold_policy, pool)
    m = out["per_kind"]
    assert set(m) == kinds
    for kind in kinds:
        assert m[kind]["episodes"] == sum(k == kind for k, _ in draws)
        assert m[kind]["infra"] == 0 and m[kind]["success_rate"] == 1.0, (kind, m[kind])
        assert m[kind]["steps"] > 0
    assert all(v.success for v in out["verifications"])
