"""RL loss (mpa_jax.rl.loss) and the generalised train step: clipped-ratio maths, exact aggregation
(one big batch == micro-batches == packed rows), extra metrics, SFT behaviour unchanged."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpa_jax import models
from mpa_jax.config import load_config_file
from mpa_jax.kernels.logprobs import naive_logprobs
from mpa_jax.rl import batch as rlbatch
from mpa_jax.rl.loss import make_rl_loss, policy_logprobs, token_losses
from mpa_jax.sft.synthetic import make_trajectories, tiny_test_config
from mpa_jax.train import step as steplib

pytestmark = pytest.mark.filterwarnings("ignore")

TEMP = 0.7


@pytest.fixture(scope="module")
def model():
    config = tiny_test_config(load_config_file("configs/tiny.py"))
    cfg = models.config_from_ml(config.model)
    params = models.registry.family_module(cfg.family).init_params(cfg, jax.random.key(1))
    return cfg, params


_JITTED = {}


def _learner_logp(cfg):
    if cfg not in _JITTED:
        _JITTED[cfg] = jax.jit(lambda p, b: policy_logprobs(cfg, p, b, temperature=TEMP, chunk=128)[0])
    return _JITTED[cfg]


def _seqs(n, cfg, params, seed=0, max_len=20):
    """Sequences with behaviour log-probs near (not at) the learner's and mixed-sign advantages."""
    trajs = make_trajectories(n, cfg.vocab_size, min_len=6, max_len=max_len, seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for t in trajs:
        s, _ = rlbatch.sequence_from_trajectory(t, float(rng.normal()), 64)
        b = rlbatch.pack([s], 64)
        b = {k: jnp.asarray(v) for k, v in b.items()}
        logp = _learner_logp(cfg)(params, b)
        lp = np.zeros(len(s.tokens), np.float32)
        lp[1:] = np.asarray(logp[0, : len(s.tokens) - 1]) + rng.normal(0, 0.3, len(s.tokens) - 1)
        s.behaviour_logprobs = lp * s.loss_mask
        s.ref_logprobs = lp + rng.normal(0, 0.1, len(lp)).astype(np.float32)
        out.append(s)
    return out


def test_token_losses_match_the_formula():
    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    batch = {
        "advantages": jnp.array([[1.0, -1.0, 2.0, -0.5]]),
        "behaviour_logprobs": jnp.array([[-1.5, -1.0, -0.5, -2.0]]),
        "ref_logprobs": jnp.array([[-1.0, -1.5, -1.0, -3.0]]),
    }
    loss, parts = token_losses(logp, batch, clip_low=0.2, clip_high=0.28, kl_coef=0.1)
    ratio = np.exp([0.5, -1.0, 0.0, -1.0])
    adv = np.array([1.0, -1.0, 2.0, -0.5])
    clipped = np.clip(ratio, 0.8, 1.28)
    pg = -np.minimum(ratio * adv, clipped * adv)
    d = np.array([0.0, 0.5, -0.5, 0.0])
    kl = np.exp(d) - d - 1
    np.testing.assert_allclose(np.asarray(loss[0]), pg + 0.1 * kl, rtol=1e-6)
    # ratio 1.65 > 1.28 with A > 0, and 0.37 < 0.8 with A < 0 (tokens 1, 3): clipped; token 2 (ratio 1) is not
    np.testing.assert_array_equal(np.asarray(parts["clip_frac"][0]), [1, 1, 0, 1])
    np.testing.assert_allclose(np.asarray(parts["kl"][0]), kl, rtol=1e-6, atol=1e-7)


def test_ratio_one_gives_the_policy_gradient_and_learner_logprobs_match_reference(model):
    cfg, params = model
    seqs = _seqs(4, cfg, params)
    b = {k: jnp.asarray(v) for k, v in rlbatch.pack(seqs, 64, pow2_rows=False).items()}
    logp, ent = jax.jit(lambda p, b: policy_logprobs(cfg, p, b, temperature=TEMP, chunk=128))(params, b)

    @jax.jit
    def reference(params, b):
        hidden = models.hidden_states(cfg, params, b["input_ids"], positions=b["positions"], segment_ids=b["segment_ids"],
                                      attention_mask=(b["segment_ids"] > 0).astype(jnp.int32))
        return naive_logprobs(hidden, models.unembedding(cfg, params), b["targets"], temperature=TEMP)

    ref_lp, ref_ent = reference(params, b)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(ref_lp), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(ref_ent), rtol=1e-5, atol=1e-5)
    # with behaviour == learner log-probs the ratio is 1, nothing is clipped and the gap is 0
    b2 = dict(b, behaviour_logprobs=jax.lax.stop_gradient(logp) * b["loss_weights"])
    loss_fn = make_rl_loss(cfg, temperature=TEMP, clip_low=0.2, clip_high=0.28, chunk=128)
    s, c, ex = jax.jit(loss_fn)(params, b2)
    m = steplib.extras_as_metrics(ex, c)
    assert float(m["clip_frac"]) == 0.0 and float(m["logprob_gap"]) < 1e-6
    assert float(m["ratio_max"]) == pytest.approx(1.0, abs=1e-5) and float(m["ratio_min"]) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(float(s), -float(jnp.sum(b["advantages"] * b["loss_weights"])), rtol=1e-5)


def test_vocab_limit_leaves_out_the_padding_rows(model):
    cfg, params = model
    seqs = _seqs(2, cfg, params)
    for s in seqs:
        s.tokens = s.tokens % 200
    b = {k: jnp.asarray(v) for k, v in rlbatch.pack(seqs, 64, pow2_rows=False).items()}
    lp_cut, _ = policy_logprobs(cfg, params, b, temperature=TEMP, chunk=128, vocab_limit=200)
    hidden = models.hidden_states(cfg, params, b["input_ids"], positions=b["positions"], segment_ids=b["segment_ids"],
                                  attention_mask=(b["segment_ids"] > 0).astype(jnp.int32))
    ref, _ = naive_logprobs(hidden, models.unembedding(cfg, params)[:, :200], b["targets"], temperature=TEMP)
    np.testing.assert_allclose(np.asarray(lp_cut), np.asarray(ref), rtol=1e-5, atol=1e-5)
    full, _ = policy_logprobs(cfg, params, b, temperature=TEMP, chunk=128)
    assert float(jnp.min(lp_cut - full)) > 0  # the cut softmax puts more mass on every in-range id


def test_one_batch_equals_micro_batches_equals_packed_rows(model, kl_coef=0.05):
    cfg, params = model
    seqs = _seqs(8, cfg, params, seed=2, max_len=16)
    loss_fn = make_rl_loss(cfg, temperature=TEMP, clip_low=0.2, clip_high=0.28, kl_coef=kl_coef, chunk=128)
    grads = jax.jit(lambda p, b, m: steplib.grads_and_stats(loss_fn, p, b, m, with_extras=True), static_argnums=2)
    # force one sequence per row: pack each alone and stack
    rows = [rlbatch.pack([s], 64, pow2_rows=False) for s in seqs]
    single = {k: jnp.asarray(np.concatenate([r[k] for r in rows])) for k in rows[0]}
    packed_np = rlbatch.pack(seqs, 64, min_rows=8, pow2_rows=False)
    assert (packed_np["segment_ids"].max(axis=1) > 1).any()  # really packed
    packed = {k: jnp.asarray(v) for k, v in packed_np.items()}
    g1, s1, c1, e1 = grads(params, single, 1)
    g4, s4, c4, e4 = grads(params, single, 4)
    gp, sp, cp, ep = grads(params, packed, 1)
    assert float(c1) == float(c4) == float(cp) == sum(float(s.loss_mask[1:].sum()) for s in seqs)
    for s_, e_, g_ in ((s4, e4, g4), (sp, ep, gp)):
        np.testing.assert_allclose(float(s_), float(s1), rtol=1e-5)
        for k in e1:
            np.testing.assert_allclose(float(e_[k]), float(e1[k]), rtol=1e-4, atol=1e-6, err_msg=k)
        for a, b in zip(jax.tree.leaves(g_), jax.tree.leaves(g1)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-7)
    assert 0.0 < float(e1["clip_frac"]) < float(c1)  # the noise makes some tokens clip, not all
    assert float(e1["kl"]) > 0


def test_train_step_reports_the_loss_extras_and_sft_metrics_stay_fixed(model):
    """The step's metric set is the fixed one plus the loss' extras (shapes only: no compilation)."""
    from mpa_jax.sft import data as sft_data
    from mpa_jax.sft.loss import make_sft_loss
    from mpa_jax.train import optimizer as optlib
    from mpa_jax.train import state as statelib

    cfg, params = model
    opt, sched = optlib.make_optimizer(lr=1e-3, warmup_steps=0, total_steps=10)
    state = statelib.init_train_state(params, opt, 0)
    rl_batch = {k: jnp.asarray(v) for k, v in rlbatch.pack(_seqs(2, cfg, params), 64, min_rows=4).items()}
    rl_loss = make_rl_loss(cfg, temperature=TEMP, clip_low=0.2, clip_high=0.28, chunk=128)
    fixed = {"loss", "loss_sum", "tokens", "grad_norm", "lr", "nonfinite"}
    for micro in (1, 2):
        _, m = jax.eval_shape(lambda s, b: steplib.train_step(s, b, loss_fn=rl_loss, optimizer=opt, schedule=sched, micro_batches=micro),
                              state, rl_batch)
        assert set(m) == fixed | {"clip_frac", "kl", "entropy", "ratio", "logprob_gap", "ratio_max", "ratio_min", "router_aux"}
    sft_batch = {k: jnp.asarray(np.stack([sft_data.pack_row([], 64)[k]] * 4)) for k in sft_data.FIELDS}
    _, m2 = jax.eval_shape(lambda s, b: steplib.train_step(s, b, loss_fn=make_sft_loss(cfg, 128), optimizer=opt, schedule=sched),
                           state, sft_batch)
    assert set(m2) == fixed


def test_budgeted_update_equals_one_big_batch_and_respects_the_budget(model):
    """`rl.update.BudgetedUpdate` over budget-derived micro-batches (rows sized to the longest episode)
    gives the same parameters and metrics as one `train.step.train_step` over every sequence in one
    batch, and no micro-batch holds more than `tokens_per_micro_batch` tokens per device."""
    from mpa_jax import sharding
    from mpa_jax.rl import update as rlupdate
    from mpa_jax.rl.learner import budgeted_micro_batches
    from mpa_jax.train import optimizer as optlib
    from mpa_jax.train import state as statelib

    cfg, params = model
    seqs = _seqs(12, cfg, params, seed=3, max_len=40)
    loss_fn = make_rl_loss(cfg, temperature=TEMP, clip_low=0.2, clip_high=0.28, kl_coef=0.05, chunk=128)
    opt, sched = optlib.make_optimizer(lr=1e-2, warmup_steps=0, total_steps=10)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 1, "expert": 1}, devices=jax.devices()[:2])
    rules = sharding.rules_from_config(load_config_file("configs/tiny.py"))
    row_sh = sharding.batch_sharding(mesh, rules, 2)
    pshape = jax.eval_shape(lambda: params)
    st_sh = statelib.state_shardings(mesh, pshape, sharding.param_shardings(cfg, mesh, rules), opt)
    budget, dp = 128, 2
    micro, row_len, rpd = budgeted_micro_batches(seqs, 512, budget, dp)
    assert row_len == 128 and rpd * row_len <= budget and len(micro) > 1  # 40-token episodes: 128-token rows
    assert all(mb["input_ids"].shape == (rpd * dp, row_len) for mb in micro)
    upd = rlupdate.BudgetedUpdate(loss_fn, opt, sched, st_sh, row_sh)
    s1, m1 = upd(statelib.state_from_params(params, opt, 0, st_sh),
                 [{k: jax.device_put(v, row_sh) for k, v in mb.items()} for mb in micro])
    big = {k: jnp.asarray(v) for k, v in rlbatch.pack(seqs, 64, pow2_rows=False).items()}
    s2, m2 = jax.jit(lambda s, b: steplib.train_step(s, b, loss_fn=loss_fn, optimizer=opt, schedule=sched))(
        statelib.init_train_state(params, opt, 0), big)
    assert set(m1) == set(m2) and float(m1["tokens"]) == float(m2["tokens"])
    for k in m1:
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=2e-4, atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)


def test_row_length_and_budget_errors():
    from mpa_jax.rl import update as rlupdate

    assert rlupdate.row_length(5, 4096) == 128 and rlupdate.row_length(900, 4096) == 1024
    assert rlupdate.row_length(1025, 4096) == 2048 and rlupdate.row_length(3000, 3072) == 3072  # capped
    with pytest.raises(ValueError, match="episode of 5000 tokens does not fit a row of config.rl.seq_len=4096"):
        rlupdate.row_length(5000, 4096)
    with pytest.raises(ValueError, match="tokens_per_micro_batch=2048 must be >= config.rl.seq_len=4096"):
        rlupdate.check_budget(4096, 2048)
    assert rlupdate.rows_per_device(1024, 8192, 3) == 4 and rlupdate.rows_per_device(1024, 8192, 40) == 8
    assert rlupdate.rows_per_device(4096, 8192, 40) == 2


def test_moe_router_aux_loss_is_part_of_the_rl_loss():
    """A tiny Qwen3.5-MoE (random init): with router_aux_loss_coef > 0 the RL loss (sum / count) is the
    coef-0 loss plus exactly coef x the router's load-balancing loss over the real tokens, it is
    reported as `router_aux`, and its gradient reaches the router."""
    from mpa_jax.models import qwen3_5_moe

    cfg = models.ModelConfig.from_hf(dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        full_attention_interval=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, tie_word_embeddings=True, model_type="qwen3_5_moe_text",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}))
    params = qwen3_5_moe.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    seqs = []
    for n in (20, 13, 27):
        mask = (np.arange(n) >= n // 2).astype(np.float32)
        seqs.append(rlbatch.RLSequence(rng.integers(0, 128, n).astype(np.int32), mask,
                                       (rng.normal(-4.5, 0.3, n) * mask).astype(np.float32), float(rng.normal())))
    b = {k: jnp.asarray(v) for k, v in rlbatch.pack(seqs, 64, pow2_rows=False).items()}
    coef = 0.25

    def loss(c):  # jitted: one compile per program is faster here than op-by-op dispatch
        return jax.jit(make_rl_loss(cfg.replace(router_aux_loss_coef=c), temperature=TEMP, clip_low=0.2, clip_high=0.28, chunk=64))

    s1, n1, e1 = loss(coef)(params, b)
    s0, n0, e0 = loss(0.0)(params, b)
    real = (b["segment_ids"] > 0).astype(jnp.int32)
    _, router = qwen3_5_moe.forward_with_aux(cfg, params, b["input_ids"], b["positions"], b["segment_ids"], real)
    lb = float(qwen3_5_moe.load_balancing_loss(cfg.replace(router_aux_loss_coef=1.0), router, real))  # the loss x 1
    assert lb > 0.5 and float(n1) == float(n0) == float(b["loss_weights"].sum())
    np.testing.assert_allclose(float(s1 / n1) - float(s0 / n0), coef * lb, rtol=1e-4)
    np.testing.assert_allclose(float(e1["router_aux"] / n1), coef * lb, rtol=1e-5)
    assert float(e0["router_aux"]) == 0.0
    g1 = jax.jit(jax.grad(lambda p: loss(coef)(p, b)[0]))(params)
    g0 = jax.jit(jax.grad(lambda p: loss(0.0)(p, b)[0]))(params)
    gate = lambda t: np.asarray(t["model"]["layers"]["0"]["mlp"]["gate"]["weight"])  # noqa: E731
    assert np.abs(gate(g1) - gate(g0)).max() > 1e-4
