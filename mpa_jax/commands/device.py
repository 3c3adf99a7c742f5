"""`mpa device emulate|call`: an emulated Android device for tests, and one tool call on any device.

    mpa device emulate --port 5555                 # serve an emulated device on 127.0.0.1:5555
    adb connect 127.0.0.1:5555
    mpa device call --device 127.0.0.1:5555 --tool search_contacts --args '{"query": "Alex"}'

`call` starts an episode (by default one that offers the whole tool catalog on persona 0's world, so
later `--no-reset` calls may use any tool; `--task ID` runs that task instead, with its own tools) unless
`--no-reset` continues the episode already on the device. It prints the Feedback as JSON and exits 0 when
the call succeeded, 1 on error Feedback (as `mpa harness call`), 2 on bad input or an unreachable device.
No jax is imported here.
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("examples: mpa device emulate --port 5555 &   then   mpa device call --device 127.0.0.1:5555"
                     " --tool search_contacts --args '{\"query\": \"Alex\"}'")
    parser.add_argument("action", choices=("emulate", "call"), help="emulate: serve an emulated device; call: run one tool")
    parser.add_argument("--port", type=int, default=5555, help="emulate: TCP port on 127.0.0.1 (default 5555)")
    parser.add_argument("--device", default=None, help="call: device serial as `adb devices` lists it (default: config.envs.adb.device)")
    parser.add_argument("--adb-port", type=int, default=None, help="adb server port (default: config.envs.adb.adb_port)")
    parser.add_argument("--tool", default=None, help="call: tool name")
    parser.add_argument("--args", default="{}", help="call: tool arguments as a JSON object")
    parser.add_argument("--task", default=None, help="call: id of the task whose episode to start (default: an episode offering the whole catalog)")
    parser.add_argument("--split", default="test", help="call --task: split to find the task in (default: test)")
    parser.add_argument("--persona", type=int, default=0, help="call: persona seed of the catalog episode's world (default 0)")
    parser.add_argument("--no-reset", action="store_true", help="call: continue the episode already running on the device")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError

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


def catalog_task(persona_seed: int = 0) -> Any:
    """A task that offers every catalog tool and checks nothing: the episode `mpa device call` starts
    when no `--task` is given, so a later `--no-reset` call may use any tool."""
    from mpa_jax.envs import Task
    from mpa_jax.envs.tools import TOOLS

    return Task(id="device-call", domain="utilities", category="tool_use", difficulty=1, instruction="",
                tools=sorted(TOOLS), verifier={}, gold=[], persona_seed=int(persona_seed))


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
    if args.task and args.no_reset:
        raise UserError("--task starts a new episode; --no-reset continues the one on the device: pass one of them")
    kw = {k: config.envs.adb[k] for k in ("reconnect_attempts", "backoff_s") if k in config.envs.adb}
    try:
        env = AdbEnv(serial, adb_port=port, command_timeout_s=float(config.envs.adb.command_timeout_s), **kw)
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        if args.no_reset:
            env.attach()
        else:
            if args.task:
                task = next((t for t in load_tasks(args.split) if t.id == args.task), None)
                if task is None:
                    raise UserError(f"no task {args.task!r} in split {args.split}")
            else:
                task = catalog_task(args.persona)
            env.reset(task)
        fb = env.step(Action.tool_call(args.tool, tool_args))
    except DeviceFault as e:
        raise UserError(str(e) if serial in str(e) else f"device {serial}: {e}") from None
    print(json.dumps(fb.to_dict(), ensure_ascii=False, indent=2, sort_keys=True))
    return 0 if fb.ok else 1
