"""`run_rl` end to end: micro model, the real sandbox env and agent loop, the embedded JAX engine, real
orbax checkpoints. Learner and sampler weights are equal after every sync, the weight version counts
the syncs, the engine never holds a buffer the next (donating) train step frees, infra failures are
retried or dropped and never rewarded, and a run killed after a checkpoint resumes exactly.

The env is the real `SandboxEnv` (reset, tools, ledger) with one change, for learnability only: an
untrained micro model never even closes a turn (every turn is cut at the token limit and becomes an
INVALID_ARGUMENTS feedback), so no episode could succeed, every group would have zero variance and no
update would run. `_PatternEnv` therefore verifies "success" by a fixed pattern over the episodes it
is created for (two of every four consecutive episodes, i.e. of every group of four), which is all the
mechanics under test need. Infra retries and drops are tested with the scripted engine below.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.config import load_config_file
from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.contract import Verification
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.rl.trainer import run_rl
from mpa_jax.sft.synthetic import tiny_test_config
from mpa_jax.train.metrics import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore")

NAMES = ("rl/success", "rl/score", "rl/output_tokens", "rl/tool_calls", "rl/competence", "rl/lambda", "rl/lambda_min",
         "rl/lambda_max", "rl/own_key_share", "rl/adv_mean",
         "rl/adv_std", "rl/zero_var_groups", "rl/clip_frac", "rl/kl", "rl/entropy", "rl/logprob_gap",
         "rl/weight_version", "rl/infra_dropped", "time/rollout_s", "time/train_s", "time/sync_s")


class _PatternEnv:
    created = 0  # episodes start in a fixed order; 16 per step, so the pattern realigns on resume

    def __init__(self):
        self.inner = SandboxEnv()
        self.index = _PatternEnv.created
        _PatternEnv.created += 1

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action):
        return self.inner.step(action)

    def verify(self):
        real = self.inner.verify()
        ok = self.index % 4 < 2
        return Verification(success=ok, score=float(ok), checks=real.checks)

    def close(self):
        self.inner.close()


def _pattern_runner():
    """An EpisodeRunner over `_PatternEnv`s (run_rl's `runner=`)."""
    from mpa_jax.rollout.runner import EnvFactory, EpisodeRunner

    return EpisodeRunner(EnvFactory(make=lambda _kind: _PatternEnv()))


def _reset_pattern():
    _PatternEnv.created = 0


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
    _reset_pattern()
    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, runner=_pattern_runner(), on_step=check, progress=False)
    assert [d for d, _ in seen] == [1, 2]
    versions = [int(m["rl/weight_version"]) for _, m in seen]
    updated = [m["rl/updates"] > 0 for _, m in seen]
    assert any(updated) and versions == list(np.cumsum(updated)) and a.weight_version == versions[-1]
    for _, m in seen:
        assert m["rl/rollouts"] == 16 and m["rl/infra_dropped"] == 0
        assert 0 <= m["rl/success"] <= 1
        if m["rl/updates"]:
            assert m["rl/logprob_gap"] < 1e-4  # float32: behaviour log-probs == learner log-probs
            assert np.isfinite(m["rl/entropy"]) and m["rl/entropy"] > 0
    recs = read_metrics(a.metrics_path)
    assert [r["step"] for r in recs] == [1, 2] and all(n in recs[0] for n in NAMES)
    final_a = _params(_state_after(a))

    # B: a run whose directory holds A's step-1 checkpoint (A "killed" after step 1) resumes and ends where A did.
    _copy_checkpoint(tmp_path / "a", tmp_path / "b", 1)
    _reset_pattern()
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_pattern_runner(), progress=False)
    assert b.resumed_from == 1 and b.weight_version == a.weight_version
    assert all(np.array_equal(x, y) for x, y in zip(final_a, _params(_state_after(b))))
    rb = [r for r in read_metrics(b.metrics_path) if r["step"] == 2][-1]
    for k, v in recs[1].items():
        if not k.startswith("time/"):
            assert rb[k] == v or (v != v and rb[k] != rb[k]), k
    extra = json.load(open(tmp_path / "b" / "checkpoints" / "2" / "extra" / "metadata"))
    assert extra["cursor"] == {"sandbox": 8} and extra["weight_version"] == a.weight_version and extra["rl_step"] == 2
    # the competence table is every verified episode of the run folded in step by step (kept groups and left-out ones)
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.rl.competence import CompetenceTable, keys_of_trajectory

    table = CompetenceTable.from_config(cfg.rl)
    for step in (1, 2):
        trajs = read_jsonl(str(tmp_path / "a" / "rollouts" / f"step_{step:06d}.jsonl"), Trajectory)
        keys, cells = zip(*[keys_of_trajectory(t) for t in trajs])
        table.update(list(keys), list(cells), [float(t.verification.success) for t in trajs])
    assert CompetenceTable.from_dict(extra["competence"]) == table and set(table.tally["key"]) == {"calc.tip_split#1"}
    lines = [json.loads(x) for x in open(tmp_path / "a" / "competence.jsonl")]
    assert [ln["step"] for ln in lines] == [1, 2] and lines[-1]["table"] == extra["competence"]
    assert all(len(ln["groups"]) == 4 and {"key", "cell", "competence", "lambda", "own"} <= set(ln["groups"][0]) for ln in lines)
    assert all(m["rl/staleness"] == 0 for _, m in seen)


def test_async_rollouts_are_one_version_stale_and_resume_exactly(tmp_path, tok):
    """Async: step k+1's rollouts sample with the weights before step k's update (staleness 1, recorded
    per trajectory); the prefetched rollouts are checkpointed, so a resume is still exact. The learner
    mesh is every host device (8 under `make test`): the engine's decode thread runs beside the
    multi-device update."""
    cfg = _config(tok, steps=2)
    cfg.rl.async_rollouts, cfg.rl.max_staleness, cfg.rl.minibatches = True, 1, 1
    seen = []

    def check(done, metrics, state, engine):
        learner = _params(state)
        sampler = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(engine.params))]
        assert all(np.array_equal(x, y) for x, y in zip(learner, sampler))
        seen.append(dict(metrics))

    _reset_pattern()
    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, runner=_pattern_runner(), on_step=check, progress=False)
    assert [m["rl/staleness"] for m in seen] == [0, 1] and all(m["rl/stale_dropped"] == 0 for m in seen)
    extra = json.load(open(tmp_path / "a" / "checkpoints" / "1" / "extra" / "metadata"))
    pre = extra["prefetched"]
    assert pre["step"] == 1 and {t["provenance"]["weight_version"] for t in pre["trajs"]} == {"0"}
    _copy_checkpoint(tmp_path / "a", tmp_path / "b", 1)
    _reset_pattern()  # the resumed step's episodes get the pattern A's step 2 got (16 per step)
    _PatternEnv.created = 16
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_pattern_runner(), progress=False)
    assert b.resumed_from == 1
    assert all(np.array_equal(x, y) for x, y in zip(_params(_state_after(a)), _params(_state_after(b))))


def _copy_checkpoint(src, dst, step):
    import shutil

    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / str(step), dst / "checkpoints" / str(step))


def _state_after(result):
    """The TrainState of a finished run's last checkpoint (restored through orbax)."""

    import orbax.checkpoint as ocp

    from mpa_jax.train import checkpoint as ckpt

    mgr = ocp.CheckpointManager(result.checkpoint_dir, item_names=("state",))
    try:
        restored = mgr.restore(mgr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    finally:
        mgr.close()
    ckpt.drop_abandoned_read_reports()

    class S:
        params = restored["state"]["params"]

    return S


def test_infra_failures_are_retried_then_dropped_never_rewarded(tok):
    """`group_rollouts` with the scripted engine: a task whose env fails once is retried and kept;
    one whose env always fails is dropped and counted (per kind)."""
    from mpa_jax.envs import load_tasks
    from mpa_jax.rl.rollouts import group_rollouts
    from mpa_jax.rollout.runner import EnvFactory, EpisodeRunner
    from mpa_jax.rollout.testing import ScriptedEngine

    tasks = [t for t in load_tasks("train") if t.template == "calc.tip_split"][:2]
    flaky, broken = tasks[0].id, tasks[1].id
    resets = {}

    class Env(SandboxEnv):
        def reset(self, task):
            resets[task.id] = resets.get(task.id, 0) + 1
            if task.id == broken or (task.id == flaky and resets[task.id] <= 2):
                raise EnvFault("device farm unreachable")  # an env-reported fault (a bug would fail the run)
            return super().reset(task)

    cfg = _config(tok)
    cfg.rl.group_size, cfg.rl.infra_retries = 3, 1
    with EpisodeRunner(EnvFactory(make=lambda _kind: Env())) as runner:
        r = group_rollouts(runner, ScriptedEngine(tok, ["All done."]), tok, [("sandbox", t) for t in tasks], rl=cfg.rl,
                           rollout=cfg.rollout, seed=int(cfg.seed), step=0)
    trajs, groups = r.trajs, r.groups
    assert r.dropped == {"sandbox": 3} and groups == [0, 0, 0] and len(trajs) == 3
    assert not any(t.infra_failure for t in trajs) and resets[broken] == 6
    assert all(t.provenance["sampling"]["for_ratios"] and t.provenance["sampling"]["top_k"] == -1 for t in trajs)


class _RecordingEngine:
    """Wraps the server's Engine to record the weight loads `/update_weights_from_disk` asks for."""

    def __init__(self, inner):
        self.inner, self.loads = inner, []

    def update_weights(self, source, version):
        self.inner.update_weights(source, version)
        self.loads.append((str(source), str(version)))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_sglang_weight_sync_over_http(tmp_path, tok):
    """The trainer's SGLang path (`rollout.engine = "sglang"`): rollouts through the SGLang client over real
    loopback HTTP, and after each update an HF export + `POST /update_weights_from_disk` + `/flush_cache`.

    SGLang itself is a GPU-only install, so the server here is the project's SGLang-API server
    (`mpa serve`'s app: `/generate`, `/update_weights_from_disk`, `/flush_cache`, driving a real
    `Engine`), with one stand-in part: its engine is wrapped to record each weight load. Checked
    after every step: the server was told to load `<workdir>/sync/weights-<version>` with the counted
    version, the exported files hold exactly the learner's weights, and the server's engine samples
    with them."""
    from mpa_jax import models
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.server import ServerThread, create_app

    cfg = _config(tok, steps=2)
    cfg.rl.minibatches = 1
    mcfg = models.config_from_ml(cfg.model)
    start = str(tmp_path / "server-start")
    models.save_pretrained(models.Model(mcfg, models.registry.family_module(mcfg.family).init_params(mcfg, jax.random.key(9))),
                           start, dtype="float32")
    served = _RecordingEngine(Engine.from_pretrained(start, max_batch=16, weight_version="start"))
    seen = []
    with ServerThread(create_app(served, tok, model_path=start, max_batch=16)) as server:
        cfg.rollout.engine, cfg.rollout.sglang_url = "sglang", server.url

        def check(done, metrics, state, engine):
            v = int(metrics["rl/weight_version"])
            assert engine.weight_version == str(v) and served.inner.weight_version == str(v)
            path, version = served.loads[-1]
            assert version == str(v) and path == str(tmp_path / "run" / "sync" / f"weights-{v}")
            learner = _params(state)
            exported = [np.asarray(x) for x in jax.tree.leaves(models.from_pretrained(path, dtype="float32").params)]
            assert all(np.array_equal(a, b) for a, b in zip(learner, exported)), "exported files are not the learner's weights"
            server_params = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(served.inner.params))]
            assert all(np.array_equal(a, b) for a, b in zip(learner, server_params))
            seen.append(dict(metrics))

        _reset_pattern()
        res = run_rl(cfg, str(tmp_path / "run"), tokenizer=tok, runner=_pattern_runner(), on_step=check, progress=False)
    updated = [m["rl/updates"] > 0 for m in seen]
    assert len(seen) == 2 and any(updated)
    # version 0 at start, then one load per step that updated: the version counts the syncs
    assert [v for _, v in served.loads] == [str(i) for i in range(sum(updated) + 1)] and res.weight_version == sum(updated)
    assert all(m["rl/rollouts"] == 16 for m in seen)


def test_non_finite_rollouts_are_refused_and_a_diverged_learner_stops_the_run(tmp_path, tok, monkeypatch):
    """The learner refuses a non-finite field with one error naming the episode; `rl.max_bad_updates`
    non-finite updates in a row stop the run with one clear error, the last good checkpoint kept. The divergence
    is injected into the learner's update (its real metrics, `nonfinite` set): producing one for real would
    also break the sampler, whose NaN log-probs the runner already turns into infra episodes."""
    from mpa_jax.envs.contract import Trajectory
    from mpa_jax.rl import batch as rlbatch
    from mpa_jax.rl.learner import Learner
    from mpa_jax.rl.trainer import RLDiverged

    traj = Trajectory(task_id="train/t/1", tokens=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, float("nan")],
                      steps=[], provenance={"seed": 7, "weight_version": "3"})
    with pytest.raises(rlbatch.BatchError, match=r"task train/t/1 \(seed 7, weights 3\).*token 2 is nan"):
        rlbatch.sequence_from_trajectory(traj, 1.0, 16)
    traj.logprobs[2] = -0.1
    with pytest.raises(rlbatch.BatchError, match="advantage is inf"):
        rlbatch.sequence_from_trajectory(traj, float("inf"), 16)

    real = Learner.update_sequences

    def diverged_after_step_1(self, seqs, step):
        metrics, layout = real(self, seqs, step)
        if step >= 1:  # steps 2, 3, ...: every update non-finite (the weights are left as they were)
            metrics = [dict(m, nonfinite=1.0) for m in metrics]
        return metrics, layout

    monkeypatch.setattr(Learner, "update_sequences", diverged_after_step_1)
    cfg = _config(tok, steps=6)
    cfg.rl.max_bad_updates = 3
    _reset_pattern()
    with pytest.raises(RLDiverged, match=r"[34] RL updates in a row .*max_bad_updates=3.*stopped at step 3.*last good checkpoint: step 1"):
        run_rl(cfg, str(tmp_path / "run"), tokenizer=tok, runner=_pattern_runner(), progress=False)
    assert sorted(int(d) for d in os.listdir(tmp_path / "run" / "checkpoints") if d.isdigit()) == [1]
    recs = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    bad = [r for r in recs if r.get("rl/nonfinite_updates")]
    assert bad and all(r["rl/weight_version"] == recs[0]["rl/weight_version"] for r in bad)  # no sync of skipped updates


def test_competence_selection_trains_on_fresh_instances_and_resumes_exactly(tmp_path, tok):
    """`rl.selection = "competence"`: every trained group is a fresh instance (no split's seed) with reward
    variance; a run stopped by SIGINT after step 1 and resumed ends with the uninterrupted run's weights, table
    and metrics."""
    from mpa_jax.rl.tasks import FRESH_SEED_BASE

    cfg = _config(tok, steps=2)
    cfg.rl.selection, cfg.rl.templates = "competence", "calc.tip_split,weather.forecast"
    finals = {}

    def keep(name):
        return lambda done, metrics, state, engine: finals.__setitem__(name, _params(state))

    _reset_pattern()
    a = run_rl(cfg, str(tmp_path / "a"), tokenizer=tok, runner=_pattern_runner(), on_step=keep("a"), progress=False)
    recs = {int(r["step"]): r for r in read_metrics(a.metrics_path)}
    for step, m in recs.items():
        assert m["rl/groups_kept"] <= 4 and m["rl/groups_drawn"] >= m["rl/groups_kept"]
        from mpa_jax.envs import Trajectory, read_jsonl

        trajs = read_jsonl(str(tmp_path / "a" / "rollouts" / f"step_{step:06d}.jsonl"), Trajectory)
        assert trajs and all("/rl/" in t.task_id and int(t.task_id.rsplit("/", 1)[1]) >= FRESH_SEED_BASE for t in trajs)
    table = [json.loads(x) for x in open(tmp_path / "a" / "competence.jsonl")]
    assert [r["step"] for r in table] == [1, 2] and set(table[-1]["templates"]) <= {"calc.tip_split", "weather.forecast"}
    # B is stopped by a SIGINT during step 1 (train.preemption): it saves at the step boundary, says so in one line
    _reset_pattern()
    import signal

    before = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN when pytest was started in the background
    stopped = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_pattern_runner(), progress=False,
                     on_step=lambda done, m, state, engine: os.kill(os.getpid(), signal.SIGINT))
    assert stopped.steps == 1 and stopped.interrupted.startswith("interrupted (SIGINT): saved step 1")
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    b = run_rl(cfg, str(tmp_path / "b"), tokenizer=tok, runner=_pattern_runner(), on_step=keep("b"), progress=False)
    assert b.resumed_from == 1
    assert all(np.array_equal(x, y) for x, y in zip(finals["a"], finals["b"]))
    rb = [r for r in read_metrics(b.metrics_path) if r["step"] == 2][-1]
    for k, v in recs[2].items():
        if not k.startswith("time/"):
            assert rb[k] == v or (v != v and rb[k] != rb[k]), k
    assert [json.loads(x) for x in open(tmp_path / "b" / "competence.jsonl")] == table
