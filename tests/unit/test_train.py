"""Training core: exact gradient under micro-batching and packing, mesh equivalence, optimizer, bf16."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from mpa_jax import models, sharding
from mpa_jax.config import load_config_file
from mpa_jax.sft import data as sft_data
from mpa_jax.sft.loss import make_sft_loss
from mpa_jax.sft.synthetic import make_trajectories, tiny_test_config
from mpa_jax.train import optimizer as optlib
from mpa_jax.train import state as statelib
from mpa_jax.train import step as steplib

pytestmark = pytest.mark.filterwarnings("ignore")


def _config():
    return tiny_test_config(load_config_file("configs/tiny.py"))


def _examples(n, seed=0, vocab=256, max_len=30):
    out = []
    for t in make_trajectories(n, vocab, min_len=6, max_len=max_len, seed=seed):
        ex, _ = sft_data.example_from_trajectory(t, 64)
        out.append(ex)
    return out


def _batch_of_rows(rows):
    return {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in sft_data.FIELDS}


def _setup(config, mesh_cfg=None, micro=1):
    cfg = models.config_from_ml(config.model)
    mesh_cfg = mesh_cfg or config.mesh
    n = int(np.prod([mesh_cfg[a] for a in sharding.MESH_AXES]))
    mesh = sharding.make_mesh(mesh_cfg, devices=jax.devices()[: max(n, 1)] if n > 0 else None)
    rules = sharding.rules_from_config(config)
    opt, sched = optlib.optimizer_from_config(config.sft)
    psh = sharding.param_shardings(cfg, mesh, rules)
    fam = models.registry.family_module(cfg.family)
    pshape = jax.eval_shape(lambda r: fam.init_params(cfg, r), jax.random.key(0))
    ssh = statelib.state_shardings(mesh, pshape, psh, opt)
    bsh = {k: sharding.batch_sharding(mesh, rules) for k in sft_data.FIELDS}
    state = statelib.create_sharded_state(lambda r: fam.init_params(cfg, r), opt, 0, ssh)
    loss_fn = make_sft_loss(cfg, 128)
    step = steplib.make_train_step(loss_fn, opt, ssh, bsh, schedule=sched, micro_batches=micro)
    return cfg, state, step, loss_fn, bsh


def test_micro_batching_gives_the_gradient_and_step_of_one_big_batch():
    config = _config()
    exs = _examples(24, max_len=21)
    rows = [sft_data.pack_row(exs[i : i + 3], 64) for i in range(0, 24, 3)]  # 8 rows, uneven token counts
    batch = _batch_of_rows(rows)
    cfg, state, _, loss_fn, _ = _setup(config)
    g1, s1, c1 = jax.jit(lambda p, b: steplib.grads_and_stats(loss_fn, p, b, 1))(state.params, batch)
    g4, s4, c4 = jax.jit(lambda p, b: steplib.grads_and_stats(loss_fn, p, b, 4))(state.params, batch)
    assert float(c1) == float(c4) == float(batch["loss_weights"].sum())
    np.testing.assert_allclose(float(s1), float(s4), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-7)


def test_packing_gives_the_loss_and_gradient_of_unpacked_examples():
    config = _config()
    exs = _examples(8, seed=3, max_len=16)
    # same [8, 64] shape both ways (one compile): 2 packed rows + 6 empty ones vs 8 single-example rows
    packed = [sft_data.pack_row(exs[:4], 64), sft_data.pack_row(exs[4:], 64)] + [sft_data.pack_row([], 64)] * 6
    single = [sft_data.pack_row([e], 64) for e in exs]
    cfg, state, _, loss_fn, _ = _setup(config)
    grads = jax.jit(lambda p, b: steplib.grads_and_stats(loss_fn, p, b))
    gp, sp, cp = grads(state.params, _batch_of_rows(packed))
    gs, ss, cs = grads(state.params, _batch_of_rows(single))
    assert float(cp) == float(cs) == sum(int(e.mask[1:].sum()) for e in exs)
    np.testing.assert_allclose(float(sp), float(ss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-7)


def test_padding_and_prompt_tokens_carry_no_loss():
    config = _config()
    cfg, state, _, loss_fn, _ = _setup(config)
    ex = _examples(1, seed=5)[0]
    row = sft_data.pack_row([ex], 64)
    noisy = dict(row)
    pad = row["segment_ids"] == 0
    noisy["input_ids"] = np.where(pad, 17, row["input_ids"])  # garbage in the padding
    prompt = (row["loss_weights"] == 0) & ~pad
    noisy["targets"] = np.where(prompt, 3, row["targets"])  # prompt targets change, but are masked
    f = jax.jit(loss_fn)
    a = f(state.params, _batch_of_rows([row]))
    b = f(state.params, _batch_of_rows([noisy]))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_sharded_meshes_give_the_losses_of_one_device():
    config = _config()
    exs = _examples(32, seed=1)
    batches = [_batch_of_rows([sft_data.pack_row([exs[(i * 8 + j) % 32]], 64) for j in range(8)]) for i in range(3)]

    def losses(mesh, micro):
        _, st, step, _, _ = _setup(config, mesh_cfg=dict(zip(sharding.MESH_AXES, mesh)), micro=micro)
        out = []
        for b in batches:
            st, m = step(st, b)
            out.append(float(m["loss"]))
        return st, out

    _, ref = losses((1, 1, 1, 1), 1)  # one device
    st_3d, mixed = losses((2, 2, 2, 1), 2)  # data x fsdp x tensor on 8 devices, 2 micro-batches
    assert max(len(x.sharding.device_set) for x in jax.tree.leaves(st_3d.params)) == 8
    np.testing.assert_allclose(mixed, ref, rtol=2e-5)
    assert ref[-1] < ref[0]


def test_schedule_warms_up_then_decays_and_clipping_and_decay_mask():
    sched = optlib.lr_schedule(1.0, warmup_steps=10, total_steps=100, end_ratio=0.1)
    assert float(sched(0)) == 0.0
    assert abs(float(sched(5)) - 0.5) < 1e-6
    assert abs(float(sched(10)) - 1.0) < 1e-6
    assert 0.1 < float(sched(55)) < 1.0
    assert abs(float(sched(100)) - 0.1) < 1e-6
    with pytest.raises(ValueError, match="learning rate"):
        optlib.lr_schedule(0.0, 1, 10)
    opt, _ = optlib.make_optimizer(lr=1.0, warmup_steps=0, total_steps=10, weight_decay=0.5, clip_norm=1.0)
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    grads = {"w": jnp.full((2, 2), 100.0), "scale": jnp.zeros((2,))}
    updates, _ = opt.update(grads, opt.init(params), params)
    # zero gradient + no decay on 1-D leaves: the norm scale does not move
    np.testing.assert_allclose(np.asarray(updates["scale"]), 0.0)
    assert float(jnp.abs(updates["w"]).max()) > 0


def test_sgd_follows_the_gradient_where_adamw_moves_every_weight():
    """RL's `rl.optimizer="sgd"`: the first step is -lr * (clipped gradient + decay on matrices), so a
    weight with a tiny gradient barely moves; AdamW's first step is about -lr for every weight."""
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    grads = {"w": jnp.asarray([[0.3, 1e-6], [0.0, -0.4]]), "scale": jnp.asarray([1e-6, 0.0])}
    sgd, _ = optlib.make_optimizer(lr=0.5, warmup_steps=0, total_steps=10, weight_decay=0.1, clip_norm=1.0, b1=0.9,
                                   end_ratio=1.0, kind="sgd")
    up, _ = sgd.update(grads, sgd.init(params), params)
    np.testing.assert_allclose(np.asarray(up["w"]), -0.5 * (np.asarray(grads["w"]) + 0.1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(up["scale"]), -0.5 * np.asarray(grads["scale"]), rtol=1e-6)
    adam, _ = optlib.make_optimizer(lr=0.5, warmup_steps=0, total_steps=10, end_ratio=1.0)
    up, _ = adam.update(grads, adam.init(params), params)
    assert abs(float(up["w"][0, 1])) > 0.4  # a 1e-6 gradient moves the weight by ~lr
    with pytest.raises(ValueError, match="optimizer must be"):
        optlib.make_optimizer(lr=0.1, warmup_steps=0, total_steps=10, kind="lion")


def test_bfloat16_compute_keeps_float32_master_weights():
    config = _config()
    config.model.compute_dtype = "bfloat16"
    exs = _examples(16, seed=2)
    batch = _batch_of_rows([sft_data.pack_row(exs[2 * i : 2 * i + 2], 64) for i in range(8)])
    _, state, step, _, _ = _setup(config)
    losses = []
    for _ in range(3):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_a_non_finite_update_is_skipped_and_reported():
    """A loss, gradient or optimizer state that turns NaN/inf leaves params, optimizer state and step as they
    were (`nonfinite` = 1); a clean state trains (`nonfinite` = 0, the step advances)."""
    config = _config()
    exs = _examples(24, max_len=21)
    batch = _batch_of_rows([sft_data.pack_row(exs[i : i + 3], 64) for i in range(0, 24, 3)])

    def run(poison):
        _, state, step, _, _ = _setup(config)
        state = poison(state)
        before = [np.asarray(x) for x in jax.tree.leaves(jax.device_get((state.params, state.opt_state)))]
        step0 = int(state.step)
        new, m = step(state, batch)
        after = [np.asarray(x) for x in jax.tree.leaves(jax.device_get((new.params, new.opt_state)))]
        return m, step0, int(new.step), before, after

    def nan_param(state):
        flat, tree = jax.tree.flatten(state.params)
        flat[0] = flat[0].at[(0,) * flat[0].ndim].set(jnp.nan)
        return statelib.TrainState(params=jax.tree.unflatten(tree, flat), opt_state=state.opt_state, step=state.step, rng=state.rng)

    def nan_moments(state):  # finite loss and gradients, a corrupted optimizer state
        opt = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating) else x, state.opt_state)
        return statelib.TrainState(params=state.params, opt_state=opt, step=state.step, rng=state.rng)

    for poison, finite_loss in ((nan_param, False), (nan_moments, True)):
        m, step0, step1, before, after = run(poison)
        assert float(m["nonfinite"]) == 1.0 and step1 == step0 and bool(np.isfinite(float(m["loss"]))) == finite_loss
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after)), poison.__name__
    m, step0, step1, before, after = run(lambda s: s)
    assert float(m["nonfinite"]) == 0.0 and step1 == step0 + 1
    assert not all(np.array_equal(a, b) for a, b in zip(before, after))
