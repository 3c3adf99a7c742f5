"""The `python -m sglang.launch_server ...` command for an exported checkpoint (SGLang 0.5.x flags), and the
`python -m sglang_router.launch_router ...` command for a fleet of them (sglang-router 0.3.x).

Tool-call parser by format: Qwen3's `<tool_call>{json}</tool_call>` is SGLang's `qwen25` parser;
Qwen3.5 / Qwen3-Coder's `<function=...><parameter=...>` XML is `qwen3_coder`. Reasoning (`<think>`)
uses the `qwen3` reasoning parser.
"""
from __future__ import annotations

import json
import os
import shlex

TOOL_CALL_PARSERS = {"json": "qwen25", "xml": "qwen3_coder"}


def detect_tool_format(checkpoint_dir: str) -> str:
    """`xml` for Qwen3.5-family checkpoints (their chat template emits XML calls), else `json`."""
    try:
        with open(os.path.join(checkpoint_dir, "config.json"), encoding="utf-8") as f:
            model_type = str(json.load(f).get("model_type", ""))
    except (OSError, ValueError):
        return "json"
    return "xml" if model_type.startswith("qwen3_5") else "json"


def sglang_launch_command(
    checkpoint_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp: int = 1,
    dp: int = 1,
    mem_fraction: float = 0.85,
    tool_format: str | None = None,
    reasoning: bool = True,
    dtype: str = "auto",
    context_length: int | None = None,
    deterministic: bool = False,
    python: str = "python",
) -> list[str]:
    """Argument vector that serves `checkpoint_dir` with SGLang; validate inputs, name the bad one.

    `deterministic`: `--enable-deterministic-inference`, without which SGLang ignores `sampling_seed`
    (seeded rollouts are then not reproducible; docs/scaling.md).
    """
    if not os.path.isfile(os.path.join(checkpoint_dir, "config.json")):
        raise ValueError(f"{checkpoint_dir} is not an exported HF checkpoint (no config.json); run `mpa export` first")
    if tp < 1 or dp < 1:
        raise ValueError(f"tp and dp must be >= 1, got tp={tp} dp={dp}")
    if not 0.0 < mem_fraction < 1.0:
        raise ValueError(f"mem_fraction must be in (0, 1), got {mem_fraction}")
    fmt = tool_format or detect_tool_format(checkpoint_dir)
    if fmt not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_format must be one of {sorted(TOOL_CALL_PARSERS)}, got {fmt!r}")
    cmd = [
        python, "-m", "sglang.launch_server",
        "--model-path", os.path.abspath(checkpoint_dir),
        "--host", host,
        "--port", str(port),
        "--tp-size", str(tp),
        "--dp-size", str(dp),
        "--mem-fraction-static", f"{mem_fraction:g}",
        "--dtype", dtype,
        "--tool-call-parser", TOOL_CALL_PARSERS[fmt],
    ]
    if reasoning:
        cmd += ["--reasoning-parser", "qwen3"]
    if context_length:
        cmd += ["--context-length", str(int(context_length))]
    if deterministic:
        cmd.append("--enable-deterministic-inference")
    return cmd


ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "consistent_hashing", "manual")


def router_launch_command(
    worker_urls: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    policy: str = "cache_aware",
    python: str = "python",
) -> list[str]:
    """Argument vector of sglang-router in front of `worker_urls`; point `rollout.sglang_url` at it."""
    if not worker_urls:
        raise ValueError("router_launch_command: give at least one worker URL")
    bad = next((u for u in worker_urls if not u.startswith(("http://", "https://"))), None)
    if bad is not None:
        raise ValueError(f"worker URL must start with http:// or https://, got {bad!r}")
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"policy must be one of {list(ROUTER_POLICIES)}, got {policy!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return [python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls, "--host", host,
            "--port", str(port), "--policy", policy]


def format_command(cmd: list[str]) -> str:
    """Shell-quoted one-liner of an argument vector."""
    return " ".join(shlex.quote(c) for c in cmd)
