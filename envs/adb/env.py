"""AdbEnv: the sandbox's tasks run on an Android device through the adb server and `adbutils`.

Per episode: reset the device (`input keyevent KEYCODE_HOME`, `am force-stop` the companion app, `content
call ... --method reset --arg TASK`), then one `content call ... --method step --arg ACTION` per action;
the companion answers the Feedback and its ledger entry. The whole task goes to the device at reset, so follow-up
conversations (`task.metadata["followups"]`) run as on the sandbox: the companion answers a reply with the
user's next turn (`Feedback.user_turn`) while turns are left. `verify()` reads the state back from the device
(`content query` per table, `settings list global` for the device table, `dumpsys battery` for its
battery level) and scores it with the same
`verify_episode` the sandbox uses, against the start state rebuilt on the host.

Every command is an argv joined with `shlex.quote`, so no argument is ever interpreted by the device
shell. Every exchange with the adb server (each read of a shell stream included) is bounded by
`command_timeout_s`, so a frozen device costs one timeout, never a hang. Faults never become rewards: a
lost device or adb server, a command timeout or output the parser does not recognise turns into
INFRA/TIMEOUT Feedback, marks the episode infra (every later step answers INFRA, `verify()` answers
`infra_error=True`), and the next `reset` reconnects with exponential backoff (an offline or suspect TCP
serial is disconnected first: `adb connect` answers "already connected" for an offline one). A device
still unreachable after the reconnect attempts raises `DeviceUnavailable` (an `envs.base.EnvUnavailable`):
a run stops on it instead of paying the reconnect time for every remaining task.
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
from mpa_jax.envs.base import EnvFault, EnvUnavailable
from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import Action, ErrorCode, Feedback, Task, ToolSpec, Verification
from mpa_jax.envs.context import ContextFormat
from mpa_jax.envs.sandbox import task_tool_specs
from mpa_jax.envs.verify import verify_episode
from mpa_jax.envs.world import World

MAX_COMMAND_BYTES = 60_000  # the adb server's request length field is 4 hex digits
_RESULT = re.compile(r"^Result: Bundle\[\{result=(.*)\}\]\s*$", re.S)
# The exit-status marker of adbutils' shell v1 (`CMD; echo X4EXIT:$?`): the device runs the same `echo`
# whether the env or adbutils opens the stream.
_EXIT = "X4EXIT:"


class DeviceFault(EnvFault):
    """The device or the adb server failed (not the policy's fault). `code` is INFRA or TIMEOUT;
    `transport` is True when the device or the server could not be reached at all (a timeout, a closed
    connection), False when it answered something wrong."""

    def __init__(self, code: ErrorCode, message: str, transport: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.transport = transport


class DeviceUnavailable(DeviceFault, EnvUnavailable):
    """The device is still not online after the reconnect attempts: no episode can run on it."""


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


def adb_client(port: int | None = None, host: str = "127.0.0.1", timeout: float | None = None) -> Any:
    """An adbutils client for the adb server on `port` (default: $ANDROID_ADB_SERVER_PORT or 5037).

    Three departures from adbutils' defaults: a lost server is an error here (adbutils would silently run
    `adb start-server` on the DEFAULT port, not ours; `AdbEnv.ensure_connected` restarts the right one);
    closing a finished stream skips adbutils' fixed 10 ms sleep (measured in bench/adb.py); and every
    connection gets a socket timeout (`timeout` when the caller passes none: adbutils leaves `list`,
    `disconnect` and `server_version` unbounded, and opens shells with its 600 s default).
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
            timeout = timeout or default_timeout
            if timeout:
                conn.conn.settimeout(timeout)
            return conn

    default_timeout = timeout
    port = int(port or os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))
    return _Client(host=host, port=port)


def start_adb_server(port: int, adb: str = "adb", timeout: float = 30.0) -> None:
    """Start (or find running) the real adb server on `port`."""
    subprocess.run([adb, "-P", str(port), "start-server"], check=True, capture_output=True, timeout=timeout)


class AdbEnv:
    """The env protocol over one device. `serial` is what `adb devices` lists (host:port for TCP devices)."""

    kind = "adb"

    def __init__(self, device: str = "", serial: str = "", adb_port: int | None = None, command_timeout_s: float = 10.0,
                 reconnect_attempts: int = 5, backoff_s: float = 0.75, start_server: bool = True,
                 context: ContextFormat | None = None) -> None:
        self.serial = serial or device
        self.context = context or ContextFormat()
        if not self.serial:
            raise ValueError("AdbEnv needs a device serial (config.envs.adb.device or --device)")
        self.adb_port = int(adb_port or os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))
        self.command_timeout_s = float(command_timeout_s)
        self.reconnect_attempts = int(reconnect_attempts)
        self.backoff_s = float(backoff_s)
        if not self.command_timeout_s > 0:
            raise ValueError(f"config.envs.adb.command_timeout_s must be > 0, got {command_timeout_s!r}")
        if self.reconnect_attempts < 1:
            raise ValueError(f"config.envs.adb.reconnect_attempts must be >= 1, got {reconnect_attempts!r}")
        self.start_server = start_server
        self.client = adb_client(self.adb_port, timeout=self.command_timeout_s)
        self.task: Task | None = None
        self.ledger: list[dict[str, Any]] = []
        self.final_message: str | None = None
        self.infra: str = ""  # why the episode is infra ("" while it is clean)
        self.commands = 0
        self.command_s = 0.0
        self.reconnects = 0  # reconnect procedures run by `ensure_connected`
        self._attached = False
        # Set by a transport fault: the adb server may still list the device as online (a frozen device keeps
        # its TCP connection), so the next `ensure_connected` reconnects instead of trusting that listing.
        self._suspect = False

    # ------------------------------------------------------------------ transport
    def shell(self, argv: Sequence[str], timeout: float | None = None) -> str:
        """Run argv on the device (quoted) within `timeout` (default `command_timeout_s`) in all; raises
        DeviceFault on any transport problem (TIMEOUT past the limit) or a non-zero exit."""
        import adbutils

        line = quote_argv(argv)
        if len(line.encode()) > MAX_COMMAND_BYTES:
            raise ValueError(f"command of {len(line.encode())} bytes exceeds the adb limit of {MAX_COMMAND_BYTES}")
        limit = float(timeout or self.command_timeout_s)
        t0 = time.perf_counter()
        try:
            returncode, output = self._shell_stream(line, limit)
        except (adbutils.AdbTimeout, TimeoutError):
            self._suspect = True
            raise DeviceFault(ErrorCode.TIMEOUT, f"device {self.serial} did not answer `{argv[0]}` within {limit:g} s"
                                                 " (command_timeout_s)", transport=True) from None
        except (adbutils.AdbError, OSError, EOFError, ValueError) as e:
            self._suspect = True
            raise DeviceFault(ErrorCode.INFRA, f"device {self.serial} unreachable: {type(e).__name__}: {e}",
                              transport=True) from None
        finally:
            self.commands += 1
            self.command_s += time.perf_counter() - t0
        if returncode != 0:
            raise DeviceFault(ErrorCode.INFRA, f"`{argv[0]}` exited {returncode}: {output.strip()[:200]}")
        return output

    def _shell_stream(self, line: str, limit: float) -> tuple[int, str]:
        """(exit status, output) of one `shell:` stream through the adb server, done within `limit` seconds.

        adbutils' `shell2` sets its timeout only after `open_shell`'s OKAY, and a frozen device never sends
        that OKAY (the adb server forwards the OPEN and waits): here the socket timeout is the time left
        before the deadline, set before every send and read.
        """
        deadline = time.monotonic() + limit
        conn = self.client.make_connection(timeout=limit)
        sock = conn.conn

        def bound() -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)

        try:
            bound()
            conn.send_command(f"host:transport:{self.serial}")
            bound()
            conn.check_okay()
            bound()
            conn.send_command(f"shell:{line}; echo {_EXIT}$?")
            bound()
            conn.check_okay()
            chunks = []
            while True:
                bound()
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            conn.close()
        out = b"".join(chunks)
        at = out.rfind(_EXIT.encode())
        if at < 0:  # the stream closed before the exit status: the device went away mid-command
            raise EOFError("the shell stream closed before the command's exit status")
        try:
            status = int(out[at + len(_EXIT):].strip())
        except ValueError:
            raise EOFError("the shell stream ended inside the command's exit status") from None
        return status, out[:at].decode("utf-8", errors="replace")

    def _content_call(self, method: str, arg: str) -> Any:
        out = self.shell(["content", "call", "--uri", EPISODE_URI, "--method", method, "--arg", arg])
        m = _RESULT.match(out)
        if m is None:
            raise DeviceFault(ErrorCode.INFRA, f"unexpected output from the companion provider: {out[:120]!r}")
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError as e:
            raise DeviceFault(ErrorCode.INFRA, f"unexpected output from the companion provider: {e}") from None

    def state(self) -> str | None:
        """The device's state as the adb server lists it ("device", "offline", "unauthorized", ...), "" when
        it is not listed, None when the adb server cannot be reached."""
        try:
            for d in self.client.list():
                if d.serial == self.serial:
                    return str(d.state)
            return ""
        except Exception:  # noqa: BLE001 - a dead, frozen or restarting server: the caller starts or waits
            return None

    def connected(self) -> bool:
        """True when the adb server lists the device as online."""
        return self.state() == "device"

    def ensure_connected(self) -> None:
        """Make sure the device is online, reconnecting with exponential backoff when it is not.

        Each attempt restarts the local adb server if it is gone and, for a TCP serial, first `adb
        disconnect`s it when it is listed but offline (or suspect after a transport fault): `adb connect`
        answers "already connected" for an offline serial and the server's own reconnect takes ~10 s,
        while disconnect + connect reaches a restarted device at once. The waits (`backoff_s`, doubling:
        0.75 + 1.5 + 3 + 6 s for the default 5 attempts) outlast that reconnect, for a device that takes
        a while to come back. Raises DeviceUnavailable when the device is still not online.
        """
        force = self._suspect
        state = self.state()
        if state == "device" and not force:
            return
        self.reconnects += 1
        delay, waited, last = self.backoff_s, 0.0, ""
        for attempt in range(self.reconnect_attempts):
            if attempt:
                state = self.state()
            if state == "device" and not (force and attempt == 0):
                self._suspect = False
                return
            last = self._reconnect(state, force=force and attempt == 0) or last
            if self.connected():
                self._suspect = False
                return
            if attempt + 1 < self.reconnect_attempts:
                time.sleep(delay)
                waited += delay
                delay *= 2
        self._suspect = False  # the next reset starts a fresh reconnect, not a forced one
        raise DeviceUnavailable(ErrorCode.INFRA, f"device {self.serial} is not online after {self.reconnect_attempts}"
                                                 f" reconnect attempts over {waited:.1f} s" + (f" ({last})" if last else ""),
                                transport=True)

    def _reconnect(self, state: str | None, force: bool = False) -> str:
        """One reconnect attempt; returns what the adb server said (or why the attempt failed)."""
        import adbutils

        try:
            if state is None and self.start_server:
                start_adb_server(self.adb_port, timeout=max(self.command_timeout_s, 10.0))
            if ":" not in self.serial:
                return f"{self.serial} is not a TCP serial: waiting for it to come back"  # USB: nothing to connect
            if state or force:  # listed (offline, or online but suspect): drop it so that connect reconnects
                self.client.disconnect(self.serial)
            return str(self.client.connect(self.serial, timeout=min(self.command_timeout_s, 5.0)) or "").strip()
        except (adbutils.AdbError, OSError, subprocess.SubprocessError) as e:
            return f"{type(e).__name__}: {e}"

    # ------------------------------------------------------------------ protocol
    def tool_specs(self, task: Task) -> list[ToolSpec]:
        return task_tool_specs(task)

    def reset(self, task: Task) -> dict[str, Any]:
        """Reset the device to the task's start state; returns the observation.

        Raises DeviceUnavailable (an `EnvUnavailable`) when the device is not online after the reconnect
        attempts, DeviceFault when a reset command fails (the next reset reconnects first).
        """
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
