"""`run_rl` end to end: micro model, the real sandbox env and agent loop, the embedded JAX engine, real
orbax checkpoints. Learner and sampler weights are equal after every sync, the weight version counts
the syncs, the engine never holds a buffer the next (donating) train step frees, infra failures are
retried or dropped and never rewarded, and a run killed after a checkpoint resumes exactly.

The env is the real `SandboxEnv` (reset, tools, ledger) with one change, for learnability only: an
untrained micro model never solves a benchmark task, so every group would have zero variance and no
update would run. `_ParityEnv` therefore verifies "success" as a deterministic function of the answer
text the model wrote (its length is even), and raises from `verify` (an infra failure) when the length is
a multiple of 5, so retries and drops happen deterministically.
"""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.config import load_config_file
from mpa_jax.envs.contract import Verification
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.rl.trainer import run_rl
from mpa_jax.sft.synthetic import tiny_test_config
from mpa_jax.train.metrics import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore")

NAMES = ("rl/success", "rl/score", "rl/output_tokens", "rl/tool_calls", "rl/competence", "rl/lambda", "rl/adv_mean",
         "rl/adv_std", "rl/zero_var_groups", "rl/clip_frac", "rl/kl", "rl/entropy", "rl/logprob_gap",
         "rl/weight_version", "rl/infra_dropped", "time/rollout_s", "time/train_s", "time/sync_s")


class _ParityEnv:
    def __init__(self):
        self.inner = SandboxEnv()
        self.answer = ""

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action):
        if action.kind == "message":
            self.answer = action.text or ""
        return self.inner.step(action)

    def verify(self):
        n = len(self.answer)
        if n % 5 == 0:
            raise RuntimeError("verifier backend unavailable")
        real = self.inner.verify()
        return Verification(success=n % 2 == 0, score=float(n % 2 == 0), checks=real.checks)

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)


def _config(tok, steps=2):
    c = tiny_test_config(load_config_file("configs/tiny.py"))
    c.model.vocab_size = tok.vocab_size  # the engine samples every id of the embedding
    c.model.max_position_embeddings = 1024
    c.rollout.max_total_tokens, c.rollout.max_new_tokens, c.rollout.max_turns, c.rollout.batch_size = 768, 12, 2, 16
    c.rollout.replicas = 1
    r = c.rl
    r.steps, r.tasks_per_step, r.group_size, r.seq_len = steps, 4, 4, 768
    r.templates, r.lr, r.minibatches, r.checkpoint_every, r.infra_retries = "calc.tip_split", 3e-3, 2, 1, 1
    r.lambda_max, r.c_lo, r.c_hi, r.temperature = 0.5, 0.0, 0.5, 1.0
    c.checkpoint.async_save = True
    return c


def _params(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]


def test_rl_end_to_end_sync_versions_infra_and_exact_resume(tmp_path, tok):
    seen = []
    held = {}

    def check(done, metrics, state, engine):
        learner = _params(state)
        sampler = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(engine.params))]
        assert all(np.array_equal(a, b) for a, b in zip(learner, sampler)), "sampler weights differ from the learner's"
        assert engine.weight_version == str(int(metrics["rl/weight_version"]))
        ours = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(state.params) for x in [x.addressable_shards[0].data]}
        theirs = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(engine.params) for x in [x.addressable_shards[0].data]}
        assert not ours & theirs, "the engine shares a buffer with the train state"
        if held:
            # the previous sync's engine params survived the donating train steps of this step
            assert not any(x.is_deleted() for x in jax.tree.leaves(held["params"]))
            assert all(np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(jax.device_get(held["params"])), held["copy"]))
        held.update(params=engine.params, copy=sampler)
        seen.append((done, dict(metrics)))

    cfg = _config(tok)
    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, env_factory=_ParityEnv, on_step=check, progress=False)
    assert [d for d, _ in seen] == [1, 2]
    versions = [int(m["rl/weight_version"]) for _, m in seen]
    updated = [m["rl/updates"] > 0 for _, m in seen]
    assert any(updated) and versions == list(np.cumsum(updated)) and a.weight_version == versions[-1]
    for _, m in seen:
        assert m["rl/rollouts"] + m["rl/infra_dropped"] == 16
        assert 0 <= m["rl/success"] <= 1
        if m["rl/updates"]:
            assert m["rl/logprob_gap"] < 1e-4  # float32: behaviour log-probs == learner log-probs
            assert np.isfinite(m["rl/entropy"]) and m["rl/entropy"] > 0
    recs = read_metrics(a.metrics_path)
    assert [r["step"] for r in recs] == [1, 2] and all(n in recs[0] for n in NAMES)
    final_a = _params(_state_after(a))

    # B: a run whose directory holds A's step-1 checkpoint (A "killed" after step 1) resumes and ends where A did.
    _copy_checkpoint(tmp_path / "a", tmp_path / "b", 1)
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, env_factory=_ParityEnv, progress=False)
    assert b.resumed_from == 1 and b.weight_version == a.weight_version
    assert all(np.array_equal(x, y) for x, y in zip(final_a, _params(_state_after(b))))
    rb = [r for r in read_metrics(b.metrics_path) if r["step"] == 2][-1]
    for k, v in recs[1].items():
        if not k.startswith("time/"):
            assert rb[k] == v or (v != v and rb[k] != rb[k]), k
    extra = json.load(open(tmp_path / "b" / "checkpoints" / "2" / "extra" / "metadata"))
    assert extra["cursor"] == 8 and extra["weight_version"] == a.weight_version and extra["rl_step"] == 2
    assert extra["competence"]["counts"]["calc.tip_split"] == sum(m["rl/rollouts"] for _, m in seen)
    assert all(m["rl/staleness"] == 0 for _, m in seen)


def test_async_rollouts_are_one_version_stale_and_resume_exactly(tmp_path, tok):
    """Async: step k+1's rollouts sample with the weights before step k's update (staleness 1, recorded
    per trajectory); the prefetched rollouts are checkpointed, so a resume is still exact. On CPU the
    learner mesh must be one device (a multi-device one is refused with a clear error)."""
    cfg = _config(tok, steps=2)
    cfg.rl.async_rollouts, cfg.rl.max_staleness, cfg.rl.minibatches = True, 1, 1
    with pytest.raises(ValueError, match="one-device learner mesh"):
        run_rl(cfg, str(tmp_path / "x"), tokenizer=tok, env_factory=_ParityEnv, progress=False)
    cfg.mesh.data = 1
    seen = []

    def check(done, metrics, state, engine):
        learner = _params(state)
        sampler = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(engine.params))]
        assert all(np.array_equal(x, y) for x, y in zip(learner, sampler))
        seen.append(dict(metrics))

    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, env_factory=_ParityEnv, on_step=check, progress=False)
    assert [m["rl/staleness"] for m in seen] == [0, 1] and all(m["rl/stale_dropped"] == 0 for m in seen)
    extra = json.load(open(tmp_path / "a" / "checkpoints" / "1" / "extra" / "metadata"))
    pre = extra["prefetched"]
    assert pre["step"] == 1 and {t["provenance"]["weight_version"] for t in pre["trajs"]} == {"0"}
    _copy_checkpoint(tmp_path / "a", tmp_path / "b", 1)
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, env_factory=_ParityEnv, progress=False)
    assert b.resumed_from == 1
    assert all(np.array_equal(x, y) for x, y in zip(_params(_state_after(a)), _params(_state_after(b))))


def _copy_checkpoint(src, dst, step):
    import shutil

    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / str(step), dst / "checkpoints" / str(step))


def _state_after(result):
    """The TrainState of a finished run's last checkpoint (restored through orbax)."""
    from mpa_jax.train import checkpoint as ckpt

    import orbax.checkpoint as ocp

    mgr = ocp.CheckpointManager(result.checkpoint_dir, item_names=("state",))
    try:
        restored = mgr.restore(mgr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    finally:
        mgr.close()
    ckpt.drop_abandoned_read_reports()

    class S:
        params = restored["state"]["params"]

    return S
