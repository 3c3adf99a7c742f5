"""`mpa device emulate|call`: an emulated Android device for tests, and one tool call on any device.

    mpa device emulate --port 5555                 # serve an emulated device on 127.0.0.1:5555
    adb connect 127.0.0.1:5555
    mpa device call --device 127.0.0.1:5555 --tool search_contacts --args '{"query": "Alex"}'

`call` starts an episode of a task that allows the tool (`--task ID`, default: the first test task that
does) unless `--no-reset` continues the episode already on the device; it prints the Feedback as JSON.
No jax is imported here.
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("emulate", "call"), help="emulate: serve an emulated device; call: run one tool")
    parser.add_argument("--port", type=int, default=5555, help="emulate: TCP port on 127.0.0.1 (default 5555)")
    parser.add_argument("--device", default=None, help="call: device serial as `adb devices` lists it (default: config.envs.adb.device)")
    parser.add_argument("--adb-port", type=int, default=None, help="adb server port (default: config.envs.adb.adb_port)")
    parser.add_argument("--tool", default=None, help="call: tool name")
    parser.add_argument("--args", default="{}", help="call: tool arguments as a JSON object")
    parser.add_argument("--task", default=None, help="call: id of the task whose episode to start (default: a test task allowing the tool)")
    parser.add_argument("--split", default="test", help="call: split to find the task in (default: test)")
    parser.add_argument("--no-reset", action="store_true", help="call: continue the episode already running on the device")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError

    if args.action == "emulate":
        from mpa_jax.envs.adb.emulator import serve_forever

        if not 0 <= args.port < 65536:
            raise UserError(f"--port must be in 0..65535, got {args.port}")
        try:
            serve_forever(args.port)
        except OSError as e:
            raise UserError(f"cannot serve on 127.0.0.1:{args.port}: {e}") from None
        return 0
    return _call(args, config, UserError)


def _call(args: argparse.Namespace, config: Any, UserError: type) -> int:
    from mpa_jax.envs import Action, load_tasks
    from mpa_jax.envs.adb.env import AdbEnv, DeviceFault

    if not args.tool:
        raise UserError("--tool is required for `mpa device call`")
    try:
        tool_args = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise UserError(f"--args is not valid JSON: {e}") from None
    if not isinstance(tool_args, dict):
        raise UserError("--args must be a JSON object")
    serial = args.device or str(config.envs.adb.device)
    if not serial:
        raise UserError("--device is required (or set config.envs.adb.device)")
    port = args.adb_port or int(config.envs.adb.adb_port)
    env = AdbEnv(serial, adb_port=port, command_timeout_s=float(config.envs.adb.command_timeout_s))
    try:
        if args.no_reset:
            env.attach()
        else:
            tasks = load_tasks(args.split)
            task = next((t for t in tasks if (t.id == args.task if args.task else args.tool in t.tools)), None)
            if task is None:
                raise UserError(f"no task {args.task!r} in split {args.split}" if args.task
                                else f"no {args.split} task allows tool {args.tool!r}")
            env.reset(task)
        fb = env.step(Action.tool_call(args.tool, tool_args))
    except DeviceFault as e:
        raise UserError(f"device {serial}: {e}") from None
    print(json.dumps(fb.to_dict(), ensure_ascii=False, indent=2, sort_keys=True))
    return 0
