"""The RL-lift recipe (configs/rl_lift.py) at Qwen3-1.7B shape, for one GPU host.

    export JAX_COMPILATION_CACHE_DIR=runs/lift_gpu/xla_cache   # compiled programs survive a restart
    mpa sft --config configs/rl_lift_gpu.py --config.model.init_from=QWEN3_1_7B_HF_DIR --workdir runs/lift_gpu/sft
    mpa experiment rl-lift --config configs/rl_lift_gpu.py --init runs/lift_gpu/sft/hf --seeds 2 --eval-every 25 \
        --workdir runs/lift_gpu

For the RL-lift question on a planner that reasons well. The first command is the planning cold start (oracle
demonstrations of the train split, the recipe's SFT shortened to `sft.steps` below); the second is the same experiment
as on CPU: competence-aware selection of fresh train instances, 8 groups x 8 rollouts per step, greedy 96 + 48 dev
evaluations every 25 steps, exact resume. Rollouts on the embedded engine over the device (`rollout.sharded`); SGLang
instead: `--config.rollout.engine=sglang --config.rollout.sglang_url=URL` (docs/scaling.md). `bench/rl_lift_gpu.py` is
the one script for a device loan. Expected wall time and what one H200 measured: docs/experiments.md "At Qwen3-1.7B
shape", docs/perf.md "On a lent H200".
"""
import os
import runpy


def get_config():
    here = os.path.dirname(os.path.abspath(__file__))
    c = runpy.run_path(os.path.join(here, "qwen3_recipes.py"))["get_config"]("qwen3_1_7b")
    c.name = "rl_lift_gpu"
    lift = runpy.run_path(os.path.join(here, "rl_lift.py"))["get_config"]().rl
    for key in ("selection", "select_tries", "select_floor", "steps", "tasks_per_step", "group_size", "optimizer", "minibatches",
                "ppo_epochs", "temperature", "algo", "lambda_max", "c_lo", "c_hi", "beta", "competence_init", "checkpoint_every"):
        c.rl[key] = lift[key]
    c.rl.lr = 1e-6  # a pretrained 1.7B model: the recipe's SFT lr / 20
    c.rl.seq_len, c.rl.tokens_per_micro_batch = 8192, 16384
    c.sft.steps, c.sft.warmup_steps = 300, 10  # the cold start: 300 x 0.5M tokens of demonstrations
    c.sft.micro_batches = 32  # 2 rows of 8,192 per micro-batch: fits one H200 (`mpa plan --devices 1`)
    c.mesh.fsdp = 1  # one GPU
    # Prompts are prefilled in chunks of 512 tokens (one program whatever the lengths; the prefix cache
    # computes each episode's earlier turns once): fewer calls per 1k-4k-token prompt than the default 256.
    c.rollout.prefill_chunk = 512
    return c
