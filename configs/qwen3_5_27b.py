"""Qwen3.5-27B (dense hybrid: Gated DeltaNet + gated attention every 4th layer): the fine-tuning recipe of configs/qwen3_recipes.py.

Set `--config.model.init_from=<HF dir>` to start from the released weights (and their tokenizer);
`mpa plan --config configs/qwen3_5_27b.py` prints the per-device memory and FLOPs of the recipe.
"""
import os
import runpy


def get_config():
    return runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_recipes.py"))["get_config"]("qwen3_5_27b")
