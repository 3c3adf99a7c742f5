"""The emulated device's userland: the shell subset a planner's tools use, over a sandbox world.

Commands (real Android syntax and output formats):
  content call|query|insert|update|delete --uri content://com.mpa.agent/...   (the companion app's provider)
  settings get|put|list global ...      (the world's `device` table: wifi, bluetooth, battery, ...)
  am start|broadcast|force-stop ...      (intents; logged)
  input text|keyevent|tap|swipe ...      (logged)
  dumpsys battery                        (the world's battery level)
  getprop [name], echo, sleep, true, false
The companion provider runs the sandbox's tool pipeline (`SandboxEnv`): `content call --method reset
--arg TASK_JSON` starts an episode, `--method step --arg ACTION_JSON` runs one action and answers the
Feedback and its ledger entry; `content query --uri content://com.mpa.agent/state/TABLE` reads a table
back (one `Row:` line per row, values as JSON so commas and quotes in data stay unambiguous).
"""
from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

from mpa_jax.envs.adb.shell import ShellSyntaxError, run_line
from mpa_jax.envs.world import ENTITY_BY_TABLE
from mpa_jax.envs.contract import Action, Task
from mpa_jax.envs.context import ContextFormat
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.envs.world import parse_id

AUTHORITY = "com.mpa.agent"
EPISODE_URI = f"content://{AUTHORITY}/episode"
STATE_URI = f"content://{AUTHORITY}/state/"
PROPS = {"ro.product.model": "MPA Emulated Device", "ro.product.name": "mpa_emu", "ro.product.device": "mpa_emu",
         "ro.build.version.sdk": "34", "ro.build.version.release": "14", "ro.serialno": "mpa-emu"}


def _opts(argv: list[str], multi: tuple[str, ...] = ()) -> dict[str, Any]:
    """`--name value` pairs (names in `multi` collect a list); a bare word is an error."""
    out: dict[str, Any] = {m: [] for m in multi}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--") or i + 1 >= len(argv):
            raise ValueError(f"Invalid argument: {a}")
        key = a[2:]
        if key in multi:
            out[key].append(argv[i + 1])
        else:
            out[key] = argv[i + 1]
        i += 2
    return out


def _bind(spec: str) -> tuple[str, Any]:
    """`--bind name:type:value` (types s, i, l, f, d, b as in `content`)."""
    try:
        name, typ, value = spec.split(":", 2)
    except ValueError:
        raise ValueError(f"Invalid binding: {spec}") from None
    conv = {"s": str, "i": int, "l": int, "f": float, "d": float, "b": lambda v: v.lower() == "true"}.get(typ)
    if conv is None:
        raise ValueError(f"Invalid binding type: {typ}")
    return name, conv(value)


def format_rows(rows: list[dict[str, Any]]) -> str:
    """`content query` output: `Row: N k=v, k=v` per row (values as JSON), or `No result found.`."""
    if not rows:
        return "No result found.\n"
    return "".join(f"Row: {i} " + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in row.items()) + "\n"
                   for i, row in enumerate(rows))


class DeviceShell:
    """One device: a sandbox world behind a shell. Thread-safe (the adb transport runs streams in threads)."""

    def __init__(self, serial: str = "emulator") -> None:
        self.serial = serial
        self.env = SandboxEnv()
        self.lock = threading.RLock()
        self.executed: list[list[str]] = []  # every argv the shell ran, in order
        self.intents: list[list[str]] = []
        self.inputs: list[list[str]] = []
        self.delay_s = 0.0  # fault hook: every command sleeps this long first (command timeouts)
        self.corrupt_output = False  # fault hook: `content` answers garbage (unexpected output)
        self._started = False
        self.closed = False

    # ------------------------------------------------------------------ entry
    def run(self, line: str) -> tuple[str, int]:
        """Run one `shell:` service command line; (output, exit status)."""
        if self.delay_s:
            time.sleep(self.delay_s)
        with self.lock:
            if self.closed:
                return "error: device offline\n", 1
            try:
                out, status = run_line(line, self._exec)
            except ShellSyntaxError as e:
                return f"/system/bin/sh: syntax error: {e}\n", 2
        return out, status

    def _exec(self, argv: list[str]) -> tuple[str, int]:
        self.executed.append(list(argv))
        cmd, args = argv[0], argv[1:]
        if self.corrupt_output and cmd == "content":
            return "\x00\x07 segfault?? <html>\n", 0
        handler = getattr(self, f"_cmd_{cmd.replace('-', '_')}", None) if cmd.isidentifier() or cmd == "true" else None
        if handler is None:
            return f"/system/bin/sh: {cmd}: inaccessible or not found\n", 127
        try:
            return handler(args)
        except (ValueError, KeyError, TypeError) as e:
            return f"Error: {e}\n", 1

    # ------------------------------------------------------------------ small commands
    def _cmd_echo(self, args: list[str]) -> tuple[str, int]:
        return " ".join(args) + "\n", 0

    def _cmd_true(self, args: list[str]) -> tuple[str, int]:
        return "", 0

    def _cmd_false(self, args: list[str]) -> tuple[str, int]:
        return "", 1

    def _cmd_sleep(self, args: list[str]) -> tuple[str, int]:
        time.sleep(min(float(args[0]), 30.0))
        return "", 0

    def _cmd_getprop(self, args: list[str]) -> tuple[str, int]:
        if args:
            return PROPS.get(args[0], "") + "\n", 0
        return "".join(f"[{k}]: [{v}]\n" for k, v in sorted(PROPS.items())), 0

    def _cmd_input(self, args: list[str]) -> tuple[str, int]:
        if not args or args[0] not in ("text", "keyevent", "tap", "swipe", "press"):
            return "Error: Unknown command: " + (args[0] if args else "") + "\n", 1
        self.inputs.append(args)
        return "", 0

    def _cmd_am(self, args: list[str]) -> tuple[str, int]:
        if not args:
            return "usage: am [subcommand] [options]\n", 1
        sub, rest = args[0], args[1:]
        self.intents.append(args)
        if sub == "force-stop":
            if rest and rest[-1] == AUTHORITY:
                self._started = False
            return "", 0
        fields = {"-a": "act", "-d": "dat", "-n": "cmp"}
        desc = " ".join(f"{fields[rest[i]]}={rest[i + 1]}" for i in range(len(rest) - 1) if rest[i] in fields)
        if sub == "start":
            return f"Starting: Intent {{ {desc} }}\n", 0
        if sub == "broadcast":
            return f"Broadcasting: Intent {{ {desc} flg=0x400000 }}\nBroadcast completed: result=0\n", 0
        return f"Error: unknown command '{sub}'\n", 1

    def _cmd_dumpsys(self, args: list[str]) -> tuple[str, int]:
        if args[:1] != ["battery"]:
            return f"Can't find service: {args[0] if args else ''}\n", 0
        dev = self.env.world.device
        level = int(dev.get("battery", 100)) if isinstance(dev.get("battery", 100), (int, float)) else 100
        return ("Current Battery Service state:\n  AC powered: false\n  USB powered: true\n  Wireless powered: false\n"
                f"  status: 2\n  health: 2\n  present: true\n  level: {level}\n  scale: 100\n  voltage: 4200\n"
                "  temperature: 250\n  technology: Li-ion\n"), 0

    def _cmd_settings(self, args: list[str]) -> tuple[str, int]:
        if len(args) < 2 or args[1] not in ("global", "system", "secure"):
            return "Invalid namespace\n", 255
        sub, world = args[0], self.env.world
        if world.persona is None:
            return "Error: no episode\n", 1
        if sub == "get" and len(args) == 3:
            v = world.device.get(args[2])
            return ("null" if v is None else json.dumps(v, ensure_ascii=False)) + "\n", 0
        if sub == "put" and len(args) == 4:
            try:
                value = json.loads(args[3])
            except json.JSONDecodeError:
                value = args[3]
            world.set_device(args[2], value)
            world.diff = []
            return "", 0
        if sub == "list":
            return "".join(f"{k}={json.dumps(v, ensure_ascii=False)}\n" for k, v in sorted(world.device.items())), 0
        return "usage: settings [--user N] get|put|list NAMESPACE [KEY [VALUE]]\n", 1

    # ------------------------------------------------------------------ content
    def _cmd_content(self, args: list[str]) -> tuple[str, int]:
        if not args:
            return "usage: adb shell content [subcommand] [options]\n", 1
        sub = args[0]
        try:
            o = _opts(args[1:], multi=("bind",))
        except ValueError as e:
            return f"Error: {e}\n", 1
        uri = o.get("uri", "")
        try:
            if sub == "call" and uri == EPISODE_URI:
                result = self._call(o.get("method", ""), o.get("arg", ""))
                # key order kept (not canonical): the planner must see the same JSON the sandbox renders
                body = json.dumps(result, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                return f"Result: Bundle[{{result={body}}}]\n", 0
            if uri.startswith(STATE_URI):
                return self._table_op(sub, uri[len(STATE_URI):], o)
        except (ValueError, KeyError, TypeError) as e:
            return (f"Error while accessing provider:{AUTHORITY}\njava.lang.IllegalArgumentException: {e}\n"), 1
        return f"Error while accessing provider:{AUTHORITY}\njava.lang.IllegalArgumentException: Unknown URI {uri}\n", 1

    def _call(self, method: str, arg: str) -> Any:
        if method == "reset":
            # {"task": <Task>, "context": {"format", "reasoning"}}: the observation is rendered in the caller's format
            req = json.loads(arg)
            task = Task.from_dict(req["task"])
            self.env.context = ContextFormat(**req.get("context", {}))
            obs = self.env.reset(task)
            self._started = True
            return {"observation": obs, "persona_seed": task.persona_seed}
        if self.env.task is None or not self._started:
            raise ValueError("no episode: call reset first")
        if method == "step":
            action = Action.from_json(arg)
            fb = self.env.step(action)
            return {"feedback": fb.to_dict(), "entry": self.env.ledger[-1] if self.env.ledger else None}
        if method == "ledger":
            return {"ledger": self.env.ledger, "final_message": self.env.final_message}
        raise ValueError(f"unknown method {method!r}")

    def _table_op(self, sub: str, table: str, o: dict[str, Any]) -> tuple[str, int]:
        world = self.env.world
        if world.persona is None:
            raise ValueError("no episode")
        if table == "device":
            rows = [{"id": k, "value": v} for k, v in sorted(world.device.items())]
            if sub != "query":
                raise ValueError("device is read-only here (use settings put)")
            return format_rows(rows), 0
        e = ENTITY_BY_TABLE[table]
        where = o.get("where")
        rid = None
        if where is not None:
            m = re.fullmatch(r"\s*id\s*=\s*'((?:[^']|'')*)'\s*", where)
            if m is None:
                raise ValueError(f"unsupported where clause: {where}")
            rid = m.group(1).replace("''", "'")
        if sub == "query":
            rows = list(world.dump({table})[table].values())
            if rid is not None:
                rows = [r for r in rows if r["id"] == rid]
            proj = o.get("projection")
            if proj:
                cols = proj.split(":")
                rows = [{c: r.get(c) for c in cols} for r in rows]
            return format_rows(rows), 0
        if sub == "insert":
            row = dict(_bind(b) for b in o["bind"])
            world.insert(e, row)
        elif sub in ("update", "delete"):
            n = parse_id(e, rid) if rid is not None else None
            if n is None or world.get(e, n) is None:
                raise ValueError(f"no row {rid!r} in {table}")
            if sub == "update":
                world.update(e, n, dict(_bind(b) for b in o["bind"]))
            else:
                world.delete(e, n)
        else:
            raise ValueError(f"unsupported operation {sub}")
        world.diff = []
        return "", 0

    def close(self) -> None:
        with self.lock:  # a command still running (a timed-out one) finishes first
            self.closed = True
            self.env.close()
