"""`mpa <command> --config configs/x.py [--config.a.b=value ...]`: the one CLI.

Commands live in `mpa_jax/commands/<name>.py` and are imported only when run, so `mpa --help` is fast
and never loads jax. Every user error exits 2 with one line naming the bad input.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Sequence

from mpa_jax.config import ConfigError, apply_override, load_config_file, save_config, split_overrides

# name -> (module, one-line help). Keep in step with docs/architecture.md.
COMMANDS: dict[str, tuple[str, str]] = {
    "tasks": ("mpa_jax.commands.tasks", "generate a task split of the sandbox benchmark as JSONL"),
    "tokenizer": ("mpa_jax.commands.tokenizer", "build the project's byte-level BPE tokenizer"),
    "oracle": ("mpa_jax.commands.oracle", "run the scripted oracle planner to make demonstration trajectories"),
    "sft": ("mpa_jax.commands.sft", "supervised planning cold start from trajectories"),
    "export": ("mpa_jax.commands.export", "turn an orbax training checkpoint into a Hugging Face directory"),
    "plan": ("mpa_jax.commands.plan", "per-device memory and FLOPs of a config's training step, without allocating"),
    "rollout": ("mpa_jax.commands.rollout", "run the agent loop over a task split and write trajectories"),
    "serve": ("mpa_jax.commands.serve", "serve a checkpoint over HTTP (SGLang-native subset + OpenAI chat and completions)"),
    "rl": ("mpa_jax.commands.rl", "online RL (CARE or vanilla group-relative) over the sandbox tasks"),
    "experiment": ("mpa_jax.commands.experiment", "named experiments (care-vs-vanilla)"),
    "starter": ("mpa_jax.commands.starter", "build the starter planner (configs/starter.py) with its datasheet"),
    "demo": ("mpa_jax.commands.demo", "the end-to-end path on the embedded default"),
    "eval": ("mpa_jax.commands.eval", "evaluate a checkpoint on the held-out benchmark -> eval.json"),
    "loop": ("mpa_jax.commands.loop", "the closed loop: data, SFT, RL rounds, eval, harness -> summary.json, report.html"),
    "harness": ("mpa_jax.commands.harness", "the harness: tools registry, tool calls, trace mining, review, eval"),
    "device": ("mpa_jax.commands.device", "emulate an Android device over adb, or run one tool on a device"),
    "memory": ("mpa_jax.commands.memory", "long-history memory: write BEAM-style suites, evaluate memory vs long context"),
}


class UserError(Exception):
    """Raised by a command for bad user input; the CLI prints its one-line message and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that fails with one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"mpa: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """`--env KIND` and `--device SERIAL` (the commands that run episodes on a kind: oracle, rollout)."""
    parser.add_argument("--env", default=None, choices=("sandbox", "adb", "bfcl", "agentdojo"),
                        help="env kind (default: config.envs.kind; bfcl/agentdojo: that benchmark's own tasks, docs/benchmark.md)")
    parser.add_argument("--device", default=None, help="device serial for --env adb (default: config.envs.adb.device)")


def apply_env_arguments(args: argparse.Namespace, config: Any) -> str:
    """Fold --env/--device into the config (`config.envs.kind`, `config.envs.adb.device`); returns the kind."""
    kind = args.env or str(config.envs.kind)
    config.envs.kind = kind
    if args.device:
        config.envs.adb.device = args.device
    if kind == "simulated":
        raise UserError("simulated envs are for training only: the benchmark (oracle/rollout over task splits)"
                        " refuses simulated episodes")
    if kind == "adb" and not str(config.envs.adb.device):
        raise UserError("--env adb needs --device SERIAL (or config.envs.adb.device)")
    return kind


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: mpa <command> --config configs/NAME.py [--config.KEY=VALUE ...] [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`mpa <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_help())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mpa: error: unknown command {name!r} (see `mpa --help`)", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    parser = _Parser(prog=f"mpa {name}", description=COMMANDS[name][1])
    parser.add_argument("--config", default="configs/tiny.py", help="experiment config file (default: configs/tiny.py)")
    parser.add_argument("--workdir", default=None, help="run directory (default: runs/<config name>)")
    module.add_arguments(parser)
    try:
        rest, overrides = split_overrides(rest)
    except ConfigError as e:
        print(f"mpa: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(rest)
    try:
        config = load_config_file(args.config)
        for key, value in overrides:
            apply_override(config, key, value)
        from mpa_jax.envs.context import ContextFormat

        ContextFormat.from_config(config)  # a bad context format is one line here, not deep inside a stage
    except (ConfigError, ValueError) as e:
        print(f"mpa: error: {e}", file=sys.stderr)
        return 2
    if args.workdir is None:
        args.workdir = os.path.join("runs", str(config.get("name", os.path.splitext(os.path.basename(args.config))[0])))
    save_config(config, args.workdir)
    try:
        return int(module.run(args, config) or 0)
    except UserError as e:
        print(f"mpa {name}: error: {e}", file=sys.stderr)
        return 2


def entry() -> None:
    """The `mpa` console script: `main` in a process whose glibc malloc uses transparent huge pages
    for large blocks (re-executed once with the tunable; see mpa_jax/hostmem.py)."""
    from mpa_jax import hostmem

    hostmem.reexec_with_huge_pages([sys.executable, "-m", "mpa_jax.cli", *sys.argv[1:]])
    raise SystemExit(main())


if __name__ == "__main__":
    # Run through the imported module, so that commands' `mpa_jax.cli.UserError` is the class caught here.
    from mpa_jax import cli as _cli

    sys.exit(_cli.main())
