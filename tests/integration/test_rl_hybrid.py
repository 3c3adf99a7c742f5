"""`run_rl` on the hybrid env mixture: the sandbox, the emulated Android device behind the REAL adb server,
and the LLM-simulated env, through the config's `EpisodeRunner`, for 2 steps.

Checked: each step's groups are drawn across the three kinds by `config.envs.mixture` and a group never
mixes kinds; per-kind metrics (`rl/episodes/<kind>`, `rl/success/<kind>`, `rl/infra_dropped/<kind>`) add up;
a device killed mid-step turns its episodes into infra failures that are dropped (never trained on, never
rewarded) while the run goes on with the other kinds; a run stopped after step 1 and resumed ends with
exactly the weights, metrics and cursors of the uninterrupted run.

Test doubles, said so: the simulated env's backend is the deterministic simulator (a stand-in for the LLM
simulator, which cannot run here). For learnability only, success is a fixed pattern over the episodes
(`_Pattern`, as in test_rl_trainer.py): an untrained micro model solves nothing, so every group would have
zero variance and no update would run; the real env still runs every call and its Verification is kept in
the checks. Everything else is real: envs, pool, adb server, device protocol, engine, learner, orbax.
"""
from __future__ import annotations

import collections
import json

import jax
import numpy as np
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.config import load_config_file
from mpa_jax.envs import make_env
from mpa_jax.envs.adb.emulator import EmulatedDevice
from mpa_jax.envs.adb.server import AdbServer
from mpa_jax.envs.contract import Verification
from mpa_jax.envs.pool import EnvPool, limits_from_config
from mpa_jax.rl.trainer import run_rl
from mpa_jax.rollout.runner import EnvFactory, EpisodeRunner
from mpa_jax.sft.synthetic import tiny_test_config
from mpa_jax.train.metrics import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore")
KINDS = ("sandbox", "simulated", "adb")


class _Pattern:
    """A real env whose success is "every other episode created" (see the module docstring)."""

    def __init__(self, inner, index: int):
        self.inner, self.index, self.kind = inner, index, inner.kind

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action):
        return self.inner.step(action)

    def verify(self):
        real = self.inner.verify()
        ok = self.index % 2 == 0
        return Verification(success=ok, score=float(ok), checks=real.checks, infra_error=real.infra_error)

    def close(self):
        self.inner.close()


class _Envs:
    """The runner's env factory: real envs by kind, pattern-verified; `kill_at` = kill the device when the
    n-th adb env of the run is created (mid-step: earlier adb episodes of that step ran on a live device)."""

    def __init__(self, config, device: EmulatedDevice, kill_at: int | None = None):
        self.config, self.device, self.kill_at = config, device, kill_at
        self.created: collections.Counter = collections.Counter()
        self.killed = False

    def __call__(self, kind: str):
        self.created[kind] += 1
        if kind == "adb" and self.kill_at is not None and self.created["adb"] == self.kill_at and not self.killed:
            self.device.stop()
            self.killed = True
        return _Pattern(make_env(kind, config=self.config), sum(self.created.values()))


def _runner(config, envs: _Envs) -> EpisodeRunner:
    return EpisodeRunner(EnvFactory(config, make=envs), pool=EnvPool(limits_from_config(config)))


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)


@pytest.fixture
def adb():
    with AdbServer() as srv, EmulatedDevice() as dev:
        srv.connect(dev.serial)
        yield srv, dev


def _config(tok, srv, dev):
    c = tiny_test_config(load_config_file("configs/tiny.py"))
    c.model.vocab_size = tok.vocab_size
    c.model.max_position_embeddings = 2048
    # the simulated apps' JSON schemas make ~850-token first prompts with the synthetic tokenizer
    c.rollout.max_total_tokens, c.rollout.max_new_tokens, c.rollout.max_turns, c.rollout.batch_size = 1280, 8, 2, 16
    c.rollout.replicas = 1
    r = c.rl
    r.steps, r.tasks_per_step, r.group_size, r.seq_len, r.tokens_per_micro_batch = 2, 6, 2, 2048, 4096
    r.templates, r.lr, r.minibatches, r.checkpoint_every, r.infra_retries = "calc.tip_split", 3e-3, 1, 1, 1
    r.simulated_tasks = 6
    c.envs.mixture.sandbox, c.envs.mixture.simulated, c.envs.mixture.adb = 1.0, 1.0, 1.0
    c.envs.adb.device, c.envs.adb.adb_port = dev.serial, srv.port
    c.envs.adb.command_timeout_s, c.envs.adb.reconnect_attempts = 5.0, 1  # a dead device gives up fast
    c.checkpoint.async_save = False
    return c


def _params(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]


def _rollouts(workdir, step):
    from mpa_jax.envs import Trajectory, read_jsonl

    return read_jsonl(str(workdir / "rollouts" / f"step_{step:06d}.jsonl"), Trajectory)


def test_hybrid_rl_per_kind_counts_exact_resume_and_a_device_killed_mid_step(tmp_path, tok, adb):
    srv, dev = adb
    cfg = _config(tok, srv, dev)
    finals = {}

    def keep(name):
        return lambda done, metrics, state, engine: finals.__setitem__(name, _params(state))

    # the uninterrupted run
    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, runner=_runner(cfg, _Envs(cfg, dev)), on_step=keep("a"), progress=False)
    recs = {int(r["step"]): r for r in read_metrics(a.metrics_path)}
    assert sorted(recs) == [1, 2]
    for step, m in recs.items():
        trajs = _rollouts(tmp_path / "a", step)
        by_kind = collections.Counter(t.provenance["env"] for t in trajs)
        assert sum(m[f"rl/episodes/{k}"] for k in KINDS if f"rl/episodes/{k}" in m) == m["rl/rollouts"] == len(trajs) == 12
        for k in KINDS:
            assert by_kind[k] == m.get(f"rl/episodes/{k}", 0) and m.get(f"rl/infra_dropped/{k}", 0) == 0
        # a group is one task on one kind: simulated tasks only on the simulated env, split tasks elsewhere
        assert all((t.provenance["env"] == "simulated") == (t.task_id.startswith("sim")) for t in trajs)
    drawn = collections.Counter(t.provenance["env"] for s in recs for t in _rollouts(tmp_path / "a", s))
    assert set(drawn) == set(KINDS), drawn  # 12 groups over two steps reach every kind of a 1:1:1 mixture
    assert any(m["rl/updates"] > 0 for m in recs.values())

    # stopped after step 1, resumed: the same weights, metrics and cursors
    run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_runner(cfg, _Envs(cfg, dev)), max_steps=1, progress=False)
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_runner(cfg, _Envs(cfg, dev)), on_step=keep("b"), progress=False)
    assert b.resumed_from == 1
    assert all(np.array_equal(x, y) for x, y in zip(finals["a"], finals["b"]))
    rb = [r for r in read_metrics(b.metrics_path) if r["step"] == 2][-1]
    for k, v in recs[2].items():
        if not k.startswith("time/"):
            assert rb[k] == v or (v != v and rb[k] != rb[k]), k
    extra_a = json.load(open(tmp_path / "a" / "checkpoints" / "2" / "extra" / "metadata"))
    extra_b = json.load(open(tmp_path / "b" / "checkpoints" / "2" / "extra" / "metadata"))
    assert extra_a["cursor"] == extra_b["cursor"] and set(extra_a["cursor"]) == set(KINDS)

    # the device dies in step 2 after its first episode there: those episodes are infra, dropped, never trained on
    step1_adb = int(recs[1].get("rl/episodes/adb", 0))
    assert recs[2].get("rl/episodes/adb", 0) >= 2, "the kill needs two adb episodes in step 2"
    envs = _Envs(cfg, dev, kill_at=step1_adb + 2)
    c = run_rl(cfg, str(tmp_path / "c"), tokenizer=tok, runner=_runner(cfg, envs), progress=False)
    assert envs.killed
    m2 = {int(r["step"]): r for r in read_metrics(c.metrics_path)}[2]
    dropped = int(m2["rl/infra_dropped/adb"])
    assert dropped >= 1 and m2["rl/infra_dropped"] == dropped and m2["rl/infra_dropped/sandbox"] == 0
    assert m2["rl/episodes/adb"] + dropped == recs[2]["rl/episodes/adb"]
    trajs = _rollouts(tmp_path / "c", 2)
    assert not any(t.infra_failure for t in trajs)  # what was kept (and trained on) is only clean episodes
    assert sum(t.provenance["env"] == "adb" for t in trajs) == m2["rl/episodes/adb"]
    assert m2["rl/episodes/sandbox"] == recs[2]["rl/episodes/sandbox"] and m2["rl/episodes/simulated"] == recs[2]["rl/episodes/simulated"]
    assert c.steps == 2
