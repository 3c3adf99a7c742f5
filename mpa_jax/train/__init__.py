"""Generic training core: state pytree, optimizer, jitted sharded step, orbax checkpoints, metrics.

Nothing here knows about tasks or SFT data; `mpa_jax.sft` and `mpa_jax.rl` supply a loss function
`loss_fn(params, batch) -> (token-loss sum, token count[, extra sums])` and batches. `memory.py` sizes a
config's training step per device without allocating (`mpa plan`).
"""
from mpa_jax.train.checkpoint import Checkpointer, CheckpointError, find_step_dir, local_rows  # noqa: F401
from mpa_jax.train.metrics import MetricsWriter, mfu, peak_flops_per_device, read_metrics, train_flops_per_token  # noqa: F401
from mpa_jax.train.optimizer import lr_schedule, make_optimizer, optimizer_from_config  # noqa: F401
from mpa_jax.train.state import (  # noqa: F401
    TrainState,
    abstract_state,
    create_sharded_state,
    init_train_state,
    param_count,
    place_state,
    state_from_params,
    state_shardings,
)
from mpa_jax.train.step import grads_and_stats, make_eval_step, make_train_step, train_step  # noqa: F401
