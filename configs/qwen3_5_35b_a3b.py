"""Qwen3.5-35B-A3B (MoE hybrid: 256 routed experts, top-8, plus a gated shared expert): the fine-tuning recipe of configs/qwen3_recipes.py.

Set `--config.model.init_from=<HF dir>` to start from the released weights (and their tokenizer);
`mpa plan --config configs/qwen3_5_35b_a3b.py` prints the per-device memory and FLOPs of the recipe.
"""
import os
import runpy


def get_config():
    return runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_recipes.py"))["get_config"]("qwen3_5_35b_a3b")
