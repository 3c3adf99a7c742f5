"""AdbEnv: the sandbox's tasks run on an Android device through the adb server and `adbutils`.

Per episode: reset the device (`input keyevent KEYCODE_HOME`, `am force-stop` the companion app, `content
call ... --method reset --arg TASK`), then one `content call ... --method step --arg ACTION` per action;
the companion answers the Feedback and its ledger entry. `verify()` reads the state back from the device
(`content query` per table, `settings list global` for the device table, `dumpsys battery` for its
battery level) and scores it with the same
`verify_episode` the sandbox uses, against the start state rebuilt on the host.

Every command is an argv joined with `shlex.quote`, so no argument is ever interpreted by the device
shell. Faults never become rewards: a lost device or adb server, a command timeout or output the parser
does not recognise turns into INFRA/TIMEOUT Feedback, marks the episode infra (every later step answers
INFRA, `verify()` answers `infra_error=True`), and the next `reset` reconnects with exponential backoff.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import time
from typing import Any, Sequence

from mpa_jax.envs.adb.device import AUTHORITY, EPISODE_URI, STATE_URI
from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec, Verification
from mpa_jax.envs.context import ContextFormat
from mpa_jax.envs.sandbox import task_tool_specs
from mpa_jax.envs.verify import verify_episode
from mpa_jax.envs.world import World

MAX_COMMAND_BYTES = 60_000  # the adb server's request length field is 4 hex digits
_RESULT = re.compile(r"^Result: Bundle\[\{result=(.*)\}\]\s*$", re.S)


class DeviceFault(Exception):
    """The device or the adb server failed (not the policy's fault). `code` is INFRA or TIMEOUT."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def quote_argv(argv: Sequence[str]) -> str:
    """One shell command line whose words are exactly `argv` (POSIX single-quote quoting).

    A NUL byte cannot be quoted (adb ends the service string at NUL): ValueError. Tool arguments never
    contain one raw, since they travel as JSON (`\u0000`).
    """
    words = [str(a) for a in argv]
    if any("\x00" in w for w in words):
        raise ValueError("a NUL byte cannot be passed to a device shell")
    return " ".join(shlex.quote(w) for w in words)


def parse_rows(text: str) -> list[dict[str, Any]]:
    """Parse `content query` output (values as JSON); raises ValueError on anything else."""
    text = text.strip()
    if text == "No result found.":
        return []
    rows, dec = [], json.JSONDecoder()
    for lineno, line in enumerate(text.split("\n")):
        m = re.match(r"Row: (\d+) ", line)
        if m is None or int(m.group(1)) != lineno:
            raise ValueError(f"unexpected content query output: {line[:80]!r}")
        i, row = m.end(), {}
        while i < len(line):
            k = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", line[i:])
            if k is None:
                raise ValueError(f"unexpected content query output: {line[:80]!r}")
            value, end = dec.raw_decode(line, i + k.end())
            row[k.group(1)] = value
            i = end
            if line.startswith(", ", i):
                i += 2
            elif i != len(line):
                raise ValueError(f"unexpected content query output: {line[:80]!r}")
        rows.append(row)
    return rows


def adb_client(port: int | None = None, host: str = "127.0.0.1") -> Any:
    """An adbutils client for the adb server on `port` (default: $ANDROID_ADB_SERVER_PORT or 5037).

    Two departures from adbutils' defaults: a lost server is an error here (adbutils would silently run
    `adb start-server` on the DEFAULT port, not ours; `AdbEnv.ensure_connected` restarts the right one),
    and closing a finished stream skips adbutils' fixed 10 ms sleep (measured in bench/adb.py).
    """
    import adbutils
    from adbutils._adb import AdbConnection

    class _Connection(AdbConnection):
        def _safe_connect(self):  # type: ignore[override]
            return self._create_socket()

        def close(self) -> None:
            sock = getattr(self, "_AdbConnection__conn", None)
            if sock is None:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            self._AdbConnection__conn = None

    class _Client(adbutils.AdbClient):
        def make_connection(self, timeout: float | None = None) -> AdbConnection:
            try:
                conn = _Connection(self.host, self.port)
            except TimeoutError:
                raise adbutils.AdbTimeout("connect to adb server timeout") from None
            if timeout:
                conn.conn.settimeout(timeout)
            return conn

    port = int(port or os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))
    return _Client(host=host, port=port)


def start_adb_server(port: int, adb: str = "adb") -> None:  # noqa: D103
    """Start (or find running) the real adb server on `port`."""
    subprocess.run([adb, "-P", str(port), "start-server"], check=True, capture_output=True, timeout=30)


class AdbEnv:
    """The env protocol over one device. `serial` is what `adb devices` lists (host:port for TCP devices)."""

    kind = "adb"

    def __init__(self, device: str = "", serial: str = "", adb_port: int | None = None, command_timeout_s: float = 10.0,
                 reconnect_attempts: int = 5, backoff_s: float = 0.05, start_server: bool = True,
                 context: ContextFormat | None = None) -> None:
        self.serial = serial or device
        self.context = context or ContextFormat()
        if not self.serial:
            raise ValueError("AdbEnv needs a device serial (config.envs.adb.device or --device)")
        self.adb_port = int(adb_port or os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))
        self.command_timeout_s = float(command_timeout_s)
        self.reconnect_attempts = int(reconnect_attempts)
        self.backoff_s = float(backoff_s)
        self.start_server = start_server
        self.client = adb_client(self.adb_port)
        self.task: Task | None = None
        self.ledger: list[dict[str, Any]] = []
        self.final_message: str | None = None
        self.infra: str = ""  # why the episode is infra ("" while it is clean)
        self.commands = 0
        self.command_s = 0.0
        self.reconnects = 0
        self._attached = False

    # ------------------------------------------------------------------ transport
    def shell(self, argv: Sequence[str], timeout: float | None = None) -> str:
        """Run argv on the device (quoted); raises DeviceFault on any transport problem or a non-zero exit."""
        import adbutils

        line = quote_argv(argv)
        if len(line.encode()) > MAX_COMMAND_BYTES:
            raise ValueError(f"command of {len(line.encode())} bytes exceeds the adb limit of {MAX_COMMAND_BYTES}")
        t0 = time.perf_counter()
        try:
            res = self.client.device(self.serial).shell2(line, timeout=timeout or self.command_timeout_s, v2=False)
        except adbutils.AdbTimeout as e:
            raise DeviceFault(ErrorCode.TIMEOUT, f"device command timed out after {timeout or self.command_timeout_s}s: {e}") from None
        except (adbutils.AdbError, OSError, EOFError, ValueError) as e:
            raise DeviceFault(ErrorCode.INFRA, f"device {self.serial} unreachable: {type(e).__name__}: {e}") from None
        finally:
            self.commands += 1
            self.command_s += time.perf_counter() - t0
        if res.returncode != 0:
            raise DeviceFault(ErrorCode.INFRA, f"`{argv[0]}` exited {res.returncode}: {res.output.strip()[:200]}")
        return res.output

    def _content_call(self, method: str, arg: str) -> Any:
        out = self.shell(["content", "call", "--uri", EPISODE_URI, "--method", method, "--arg", arg])
        m = _RESULT.match(out)
        if m is None:
            raise DeviceFault(ErrorCode.INFRA, f"unexpected output from the companion provider: {out[:120]!r}")
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError as e:
            raise DeviceFault(ErrorCode.INFRA, f"unexpected output from the companion provider: {e}") from None

    def connected(self) -> bool:
        """True when the adb server lists the device as online."""
        try:
            return any(d.serial == self.serial and d.state == "device" for d in self.client.list())
        except Exception:
            return False

    def ensure_connected(self) -> None:
        """Reconnect with exponential backoff: restart the local adb server if it is gone, `adb connect` TCP serials."""
        delay = self.backoff_s
        for attempt in range(self.reconnect_attempts):
            if self.connected():
                return
            self.reconnects += attempt == 0
            try:
                if self.start_server:
                    start_adb_server(self.adb_port)
                if ":" in self.serial:
                    self.client.connect(self.serial, timeout=5)
            except Exception:
                pass
            if self.connected():
                return
            time.sleep(delay)
            delay *= 2
        raise DeviceFault(ErrorCode.INFRA, f"device {self.serial} is not online after {self.reconnect_attempts} attempts")

    # ------------------------------------------------------------------ protocol
    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return task_tool_specs(task)

    def reset(self, task: Task) -> dict[str, Any]:
        """Reset the device to the task's start state; returns the observation. Raises DeviceFault when offline."""
        self.task, self.ledger, self.final_message, self.infra = task, [], None, ""
        self.ensure_connected()
        self.shell(["input", "keyevent", "KEYCODE_HOME"])
        self.shell(["am", "force-stop", AUTHORITY])
        # the task's JSON keeps its gold argument order; the device renders the observation in this run's format
        arg = '{"context":' + json.dumps(self.context.to_dict()) + ',"task":' + task.to_json() + "}"
        res = self._content_call("reset", arg)
        if not isinstance(res, dict) or not isinstance(res.get("observation"), dict):
            raise DeviceFault(ErrorCode.INFRA, "the companion answered reset without an observation")
        return res["observation"]

    def attach(self) -> None:
        """Continue the episode already running on the device (no reset; `verify` is unavailable)."""
        self.ensure_connected()
        self._attached = True

    def step(self, action: Any) -> Feedback:
        """Run one action on the device; never raises."""
        call_id = getattr(action, "call_id", "") or f"call_{len(self.ledger)}"
        if self.task is None and not self._attached:
            return Feedback.error(ErrorCode.INFRA, "reset(task) must be called before step()", call_id)
        if self.infra:
            return Feedback.error(ErrorCode.INFRA, f"episode abandoned after a device fault: {self.infra}", call_id)
        if not isinstance(action, Action):
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"expected an Action, got {type(action).__name__}", call_id)
        try:
            body = action.to_json()
        except (TypeError, ValueError) as e:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, f"arguments are not JSON-serialisable: {e}", call_id)
        try:
            res = self._content_call("step", body)
            fb = Feedback.from_dict(res["feedback"])
        except DeviceFault as e:
            return self.mark_infra(e.code, str(e), call_id)
        except ValueError as e:  # an over-long command: the policy's doing
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, str(e), call_id)
        except Exception as e:  # the provider answered something that is not a Feedback
            return self.mark_infra(ErrorCode.INFRA, f"unexpected step answer: {type(e).__name__}: {e}", call_id)
        if res.get("entry") is not None:
            self.ledger.append(res["entry"])
        if action.kind == "message" and fb.ok:
            self.final_message = action.text
        return fb

    def mark_infra(self, code: ErrorCode, message: str, call_id: str = "") -> Feedback:
        """Mark the episode infra (no partial state will be scored) and answer the fault as Feedback."""
        self.infra = self.infra or message
        return Feedback.error(code, message, call_id)

    def read_state(self, tables: set[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """Device state of `tables`, read back over adb, in World.dump's shape."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for table in sorted(tables):
            if table == "device":
                text = self.shell(["settings", "list", "global"])
                dev: dict[str, dict[str, Any]] = {}
                for line in text.strip().split("\n") if text.strip() else []:
                    key, sep, value = line.partition("=")
                    if not sep:
                        raise DeviceFault(ErrorCode.INFRA, f"unexpected settings output: {line[:80]!r}")
                    try:
                        dev[key] = {"value": json.loads(value)}
                    except json.JSONDecodeError:
                        raise DeviceFault(ErrorCode.INFRA, f"unexpected settings value: {line[:80]!r}") from None
                if "battery" in dev:  # the battery level is Android's own: read it where Android reports it
                    dev["battery"] = {"value": self.battery_level()}
                out["device"] = dev
                continue
            try:
                rows = parse_rows(self.shell(["content", "query", "--uri", STATE_URI + table]))
            except ValueError as e:
                raise DeviceFault(ErrorCode.INFRA, str(e)) from None
            out[table] = {r["id"]: r for r in rows}
        return out

    def battery_level(self) -> int:
        """`dumpsys battery`'s `level:` line; DeviceFault on any other output."""
        m = re.search(r"^\s*level: (\d+)\s*$", self.shell(["dumpsys", "battery"]), re.M)
        if m is None:
            raise DeviceFault(ErrorCode.INFRA, "unexpected dumpsys battery output (no level line)")
        return int(m.group(1))

    def start_state(self, tables: set[str]) -> dict[str, Any]:
        """The task's start state rebuilt on the host (persona + patch), for the start/end comparison."""
        w = World()
        try:
            w.load(self.task.persona_seed, self.task.initial_state)
            return w.dump(tables)
        finally:
            w.close()

    def verify(self) -> Verification:
        """Score from the device's state; `infra_error=True` (score 0) when the episode hit a device fault."""
        if self.task is None or self.infra:
            return Verification(success=False, score=0.0, infra_error=True)
        tables = {"device"}
        for entry in self.ledger:
            tables.update(d["table"] for d in entry.get("diff", ()))
        v = self.task.verifier
        for g in [*v.get("goals", []), *v.get("minefields", [])]:
            if "entity" in g:
                tables.add(ENTITY_BY_NAME[g["entity"]].table)
        try:
            end = self.read_state(tables)
        except DeviceFault as e:
            self.mark_infra(e.code, str(e))
            return Verification(success=False, score=0.0, infra_error=True)
        return verify_episode(v, self.start_state(tables), end, self.ledger, self.final_message)

    def close(self) -> None:
        self.task = None
