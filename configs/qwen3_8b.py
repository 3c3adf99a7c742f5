"""Qwen3-8B (untied embeddings): the fine-tuning recipe of configs/qwen3_recipes.py.

Set `--config.model.init_from=<HF dir>` to start from the released weights (and their tokenizer);
`mpa plan --config configs/qwen3_8b.py` prints the per-device memory and FLOPs of the recipe.
"""
import os
import runpy


def get_config():
    return runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_recipes.py"))["get_config"]("qwen3_8b")
