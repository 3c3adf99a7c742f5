"""The `python -m sglang.launch_server ...` command for an exported checkpoint (SGLang 0.5.x flags).

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
    python: str = "python",
) -> list[str]:
    """Argument vector that serves `checkpoint_dir` with SGLang; validate inputs, name the bad one."""
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
    return cmd


def format_command(cmd: list[str]) -> str:
    """Shell-quoted one-liner of an argument vector."""
    return " ".join(shlex.quote(c) for c in cmd)
