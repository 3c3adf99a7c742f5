"""`mpa <command> [--config NAME|FILE] [--config.a.b=value ...] [--checkpoint PATH|starter]`: the one CLI.

Commands live in `mpa_jax/commands/<name>.py` and are imported only when run, so `mpa --help` is fast
and never loads jax. Every user error exits 2 with one line naming the bad input.

`--config` takes a config name (`tiny`, resolved in the repository's configs/ from any directory) or a
file path. A command that starts from a checkpoint declares `--checkpoint` with `add_start_argument`; the
CLI resolves it (`mpa_jax.start`) and fits the config to it before the resolved config is saved, so the
run directory's config is what runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
from typing import Any, Sequence

from mpa_jax.errors import ConfigError, UserError  # noqa: F401  (UserError: the one class commands raise)
from mpa_jax.config import DEFAULT_CONFIG, load_config, resolve_config_path, save_config, split_overrides, validate

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
    "experiment": ("mpa_jax.commands.experiment", "named experiments (care-vs-vanilla, rl-lift)"),
    "starter": ("mpa_jax.commands.starter", "build the starter planner (configs/starter.py) with its datasheet"),
    "eval": ("mpa_jax.commands.eval", "evaluate a checkpoint on the held-out benchmark -> eval.json"),
    "loop": ("mpa_jax.commands.loop", "the closed loop: data, SFT, RL rounds, eval, harness -> summary.json, report.html"),
    "harness": ("mpa_jax.commands.harness", "the harness: tools registry, tool calls, trace mining, review, eval"),
    "device": ("mpa_jax.commands.device", "emulate an Android device over adb, or run one tool on a device"),
    "memory": ("mpa_jax.commands.memory", "long-history memory: write BEAM-style suites, evaluate memory vs long context"),
}




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


def add_distributed_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """`--distributed` (what it does: `what`) with `--coordinator/--num-processes/--process-id` (sft, export)."""
    parser.add_argument("--distributed", action="store_true", help=f"multi-host: {what}")
    parser.add_argument("--coordinator", default=None, help="host:port of process 0 (with --distributed)")
    parser.add_argument("--num-processes", type=int, default=None, help="number of processes (with --distributed)")
    parser.add_argument("--process-id", type=int, default=None, help="this process' index (with --distributed)")


def init_distributed(args: argparse.Namespace) -> None:
    """`jax.distributed.initialize` from the flags of `add_distributed_arguments` (None lets jax auto-detect
    the cluster); nothing without `--distributed`."""
    if not args.distributed:
        return
    import jax

    # CPU collectives across processes (only used when the platform is CPU; must precede initialize)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)


START_HELP = ("the checkpoint to start from: a Hugging Face directory, an orbax run directory (an `mpa sft` / `mpa rl`"
              " workdir, its checkpoints/ or a step dir) or `starter` (the shipped starter planner); its own tokenizer,"
              " context format, model shape and positions are used (see docs/checkpoints.md)")


def add_start_argument(parser: argparse.ArgumentParser, *, required: bool = False, extra: str = "") -> None:
    """`--checkpoint PATH|starter`, the one flag every command that takes a start uses (same meaning
    everywhere). The CLI resolves it and fits the config before the command runs (`args.start`)."""
    parser.add_argument("--checkpoint", default=None, required=required, metavar="PATH|starter", help=START_HELP + extra)
    parser.set_defaults(takes_start=True)


def _resumed_start(command: str, workdir: str) -> str | None:
    """The start a run directory was begun from (its card's recipe.start), when the same command
    continues it without naming one: `mpa rl --workdir runs/rl` resumes with its model and tokenizer."""
    from mpa_jax.card import CARD

    path = os.path.join(workdir, CARD)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        card = json.load(f)
    start = (card.get("recipe") or {}).get("start")
    if card.get("stage") != command or not start:
        return None
    print(f"mpa: note: continuing {workdir} from its start {start} (its card; --checkpoint names another)", file=sys.stderr)
    return str(start)


def _fit_to_start(args: argparse.Namespace, config: Any, explicit: set[str], command: str) -> Any:
    """Resolve `--checkpoint` (or a `config.model.init_from` set on the command line or in the config;
    else, continuing a run of the same command, the start its card names) and return the config fitted
    to it; `args.start` is the Start or None."""
    from mpa_jax.start import StartError, config_for_start, resolve_start

    named = args.checkpoint if args.checkpoint not in (None, "", "untrained") else None
    init = str(config.model.init_from or "") if "model" in config else ""
    if named and init and "model.init_from" in explicit and os.path.abspath(os.path.expanduser(init)) != os.path.abspath(named):
        raise ConfigError(f"--checkpoint {named} and --config.model.init_from={init} name two starts: give --checkpoint only")
    args.start = None
    label = "--checkpoint" if named else "config.model.init_from"
    if not (named or init):
        named, label = _resumed_start(command, args.workdir), f"the start named in {args.workdir}'s card"
        if not named:
            return config
    try:
        args.start = resolve_start(named or init)
        return config_for_start(config, args.start, workdir=args.workdir, explicit=explicit)
    except StartError as e:
        raise ConfigError(f"{label}: {e}") from None


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: mpa <command> [--config NAME|FILE] [--config.KEY=VALUE ...] [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`--config` takes a config name (tiny, starter, micro, qwen3_1_7b, ...; default tiny) or a file path.",
              "`--checkpoint PATH|starter` names the start (an HF directory, a run directory, or the shipped starter)",
              "for every command that takes one. `mpa <command> --help` shows a command's options."]
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
    parser = _Parser(prog=f"mpa {name}", description=COMMANDS[name][1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG, metavar="NAME|FILE",
                        help=f"experiment config: a name in the repository's configs/ (e.g. tiny, starter) or a file path (default: {DEFAULT_CONFIG})")
    parser.add_argument("--workdir", default=None, help="run directory (default: runs/<config name>)")
    module.add_arguments(parser)
    try:
        rest, overrides = split_overrides(rest)
    except ConfigError as e:
        print(f"mpa: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(rest)
    args.command_line = "mpa " + shlex.join([name, *argv[1:]])  # the recipe recorded in checkpoint cards
    try:
        args.config_file = os.path.abspath(resolve_config_path(args.config))
        config = load_config(args.config_file, overrides)
        if args.workdir is None:
            args.workdir = os.path.join("runs", str(config.name))
        if getattr(args, "takes_start", False):
            config = _fit_to_start(args, config, {key for key, _ in overrides}, name)
            validate(config)  # the start may have changed the context format or positions
    except (ConfigError, ValueError) as e:
        print(f"mpa: error: {e}", file=sys.stderr)
        return 2
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
    sys.exit(main())
