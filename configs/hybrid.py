"""Hybrid-environment RL from the starter planner: `mpa rl` draws each step's groups across the sandbox, the
LLM-simulated apps and an Android device by `envs.mixture` (a group never mixes kinds; docs/loop.md).

    mpa device emulate --port 5555 &             # or a real device / emulator: adb devices
    mpa rl --config configs/hybrid.py --init starter --config.envs.adb.device=127.0.0.1:5555

The device holds one episode at a time (the runner caps live adb episodes at 1); a device that dies mid-step
turns its episodes into infra failures, re-run `rl.infra_retries` times and then dropped (never rewarded).
Simulated episodes are training-only: the loop never counts them in competence nor mines them.
"""
import os

import ml_collections

from mpa_jax.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(__file__), "starter.py"))
    c.name = "hybrid"
    c.envs.mixture.sandbox, c.envs.mixture.simulated, c.envs.mixture.adb = 0.6, 0.3, 0.1
    c.envs.adb.device = "127.0.0.1:5555"
    c.rl.simulated_tasks = 128
    c.rl.tasks_per_step, c.rl.group_size = 8, 8
    # the simulated apps show JSON schemas (longer first prompts than the compact sandbox ones)
    c.rollout.max_total_tokens = 2048
    c.rl.seq_len = 2048
    return c
