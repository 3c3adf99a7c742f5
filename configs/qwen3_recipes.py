"""Fine-tuning recipes for the pretrained Qwen3 / Qwen3.5 sizes, in one place (big_vision style).

`get_config(arg)` with arg one of `SIZES` ("qwen3_1_7b", "qwen3_8b", "qwen3_5_27b", "qwen3_5_35b_a3b");
`configs/<arg>.py` is a two-line file calling it. Everything the sizes share is set once below; what
differs per size lives in two tables: `SHAPES` (the released architecture, Hugging Face config.json
names) and `RECIPES` (learning rate, batch, sequence length, remat, mesh, rules).

These configs are meant for `model.init_from=<HF dir>` (the checkpoint's config.json then gives the
shapes, and its tokenizer is used: `mpa_jax.tokenizer.select`); the shapes here make `mpa plan` and
the abstract builds right without the weights at hand.
"""
import os

import ml_collections

from mpa_jax.config import load_config_file

SIZES = ("qwen3_1_7b", "qwen3_8b", "qwen3_5_27b", "qwen3_5_35b_a3b")

# Qwen3 recipes target one GPU host (cuDNN fused attention), Qwen3.5 a TPU slice (Pallas splash
# attention); both fall back to XLA attention where the kernel does not take the shapes or backend.
_QWEN3 = dict(family="qwen3", attention_impl="cudnn", vocab_size=151936, head_dim=128, num_key_value_heads=8, rope_theta=1_000_000.0,
              max_position_embeddings=40960)
_QWEN3_5 = dict(attention_impl="splash", vocab_size=248320, head_dim=256, full_attention_interval=4, partial_rotary_factor=0.25,
                linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                rope_theta=10_000_000.0, max_position_embeddings=262144, tie_word_embeddings=False,
                delta_impl="pallas")  # the Pallas gated-delta kernel on GPU/TPU; `jnp` on CPU

SHAPES = {
    "qwen3_1_7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True),
    "qwen3_8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=False),
    "qwen3_5_27b": dict(_QWEN3_5, family="qwen3_5", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                        num_attention_heads=24, num_key_value_heads=4, linear_num_value_heads=48),
    "qwen3_5_35b_a3b": dict(_QWEN3_5, family="qwen3_5_moe", hidden_size=2048,
                            intermediate_size=512,  # unused by MoE layers; kept equal to the expert width
                            num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                            linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512, router_aux_loss_coef=0.001),
}

# Full fine-tuning from the released weights: smaller models take a larger lr; the hybrid 27B the
# smallest. Rows are packed sequences of `seq_len` tokens (oracle episodes are 1-3k tokens), so a
# batch is rows * seq_len tokens (~0.5M for 1.7B/8B, ~1M for the 27B/35B). Remat: 1.7B keeps the
# dot outputs (micro-batches of 2 rows of 8k per GPU on 8 GPUs), larger models recompute the whole
# layer. `mpa plan --config configs/NAME.py` shows what each setting costs per device.
# Scanned layers: compile time no longer grows with depth (docs/perf.md).
RECIPES = {
    "qwen3_1_7b": dict(lr=2e-5, batch_size=64, seq_len=8192, micro_batches=4, remat="dots", scan_layers=True,
                       mesh=dict(data=1, fsdp=-1, tensor=1, expert=1)),
    "qwen3_8b": dict(lr=1e-5, batch_size=64, seq_len=8192, micro_batches=2, remat="full", scan_layers=True,
                     mesh=dict(data=1, fsdp=-1, tensor=1, expert=1)),
    "qwen3_5_27b": dict(lr=5e-6, batch_size=128, seq_len=8192, micro_batches=4, remat="full", scan_layers=True,
                        mesh=dict(data=1, fsdp=-1, tensor=1, expert=1)),
    # Experts over the `expert` axis when it is > 1 (--config.mesh.expert=8): the batch then also splits
    # over it, as over fsdp, so no device idles on the dense layers.
    # Not scanned: released MoE checkpoints store experts per expert, which the stacked layout does not
    # map yet (models/qwen3_5.hf_mapping).
    "qwen3_5_35b_a3b": dict(lr=1e-5, batch_size=128, seq_len=8192, micro_batches=4, remat="full", scan_layers=False,
                            mesh=dict(data=1, fsdp=-1, tensor=1, expert=1),
                            rules={"batch": ("data", "fsdp", "expert")}),
}

STEPS = 2000
WARMUP_FRACTION = 0.03


def get_config(arg: str = "qwen3_8b") -> ml_collections.ConfigDict:
    """The recipe for size `arg` (one of SIZES) on top of configs/tiny.py's keys."""
    if arg not in SHAPES:
        raise ValueError(f"unknown Qwen recipe {arg!r} (one of {', '.join(SIZES)})")
    c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny.py"))
    c.name = arg
    shape, recipe = SHAPES[arg], RECIPES[arg]

    m = c.model
    for key, value in shape.items():
        m[key] = value
    m.rms_norm_eps = 1e-6
    m.param_dtype = "float32"  # master weights; AdamW moments take the same dtype
    m.compute_dtype = "bfloat16"
    m.remat = recipe["remat"]
    m.scan_layers = recipe["scan_layers"]  # one compiled block instead of L layers (models/scan.py)
    m.logprob_chunk = 8192  # vocabulary chunk: [tokens, 8192] float32 logits at a time
    c.tokenizer.vocab_size = shape["vocab_size"]  # only for from-scratch runs (init_from brings its own)

    for axis, size in recipe["mesh"].items():
        c.mesh[axis] = size
    rules = dict(c.sharding_rules)
    rules.update(recipe.get("rules", {}))
    c.sharding_rules = tuple(rules.items())

    s = c.sft
    s.lr, s.batch_size, s.seq_len, s.micro_batches = recipe["lr"], recipe["batch_size"], recipe["seq_len"], recipe["micro_batches"]
    s.steps = STEPS
    s.warmup_steps = int(STEPS * WARMUP_FRACTION)
    s.lr_end_ratio = 0.1
    s.weight_decay = 0.01
    s.b2 = 0.95
    s.log_every, s.eval_every, s.eval_batches = 10, 200, 4
    s.export = True
    c.checkpoint.every, c.checkpoint.keep = 200, 3
    c.oracle.max_tasks = 0  # every train task
    c.oracle.variants = 4
    c.rollout.sharded = True  # the embedded engine on the mesh, not one device
    c.harness.skills = True  # pretrained chat models read retrieved skills in the system prompt
    return c


if __name__ == "__main__":
    import sys

    print(get_config(sys.argv[1] if len(sys.argv) > 1 else "qwen3_8b"))
