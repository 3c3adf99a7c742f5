"""MCP servers as tool providers, through the official `mcp` SDK over stdio.

Each server is a subprocess started from an argv (never through a shell), in its own process group. One
background thread runs an asyncio loop; one task on it holds the SDK client session from start to close
(anyio scopes must be left by the task that entered them); the runtime calls synchronously.

- Start: the handshake and the tool listing must finish within `timeout_s`; a server that hangs is killed
  (its whole process group) before MCPStartError is raised, and one that dies is reported with its exit
  code and the last lines it printed on stderr.
- stderr: captured through a pipe, never the terminal: each line goes to the `log` file (prefixed with
  the server's name) and the last lines are kept for error messages.
- Names: `prefix` / `rename` show a server's tools to the planner under other names (a clash with the
  sandbox catalog, or between servers); calls arrive under the shown name and reach the server under its
  own. An allow-list hides the other tools; calling one answers PERMISSION_DENIED.
- Calls: a timeout is TIMEOUT Feedback and the hung server is killed; a server that dies or breaks the
  protocol answers INFRA and is started again for the next call, so one crashed server never ends the
  episode loop. A tool's own error keeps the server's message and gets the code its text names
  (`tool_error_code`): INVALID_ARGUMENTS only for argument problems.

The SDK's `stdio_client` is not used because it hides the process: its exit code, its pid (to kill a hung
start from the calling thread) and a stderr that is not a terminal. `_stdio_transport` below is the same
newline-delimited JSON-RPC over the process's stdin/stdout.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, AsyncIterator, Sequence

from mpa_jax.envs.contract import ErrorCode, Feedback, ToolSpec
from mpa_jax.harness.config import DEFAULT_MAX_RESULT_CHARS, MCPServerSpec, TOOL_NAME
from mpa_jax.harness.results import cap_result

# The variables every server gets from our environment (what a program needs to run: the MCP SDK's own
# default set, plus locale, time zone and temp dir); any other must be named by the server's entry (`env=`).
BASE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR")
# A JSON-RPC line from a server may be at most this many times the answer cap (`harness.max_result_chars`; an
# answer carries its text and structured copy, JSON-escaped) and at least WIRE_MIN_CHARS (a capped answer is still
# read whole once, for the digest of what was cut: a 6 MB git diff must pass); with no cap,
# WIRE_MAX_CHARS. A server that sends more is stopped before its line fills our memory.
WIRE_FACTOR, WIRE_MIN_CHARS, WIRE_MAX_CHARS = 64, 32 << 20, 64 << 20
STDERR_TAIL_LINES = 5  # the last stderr lines an error message quotes (the log file has them all)
_GRACE_S = 2.0  # after stdin closes, the server may exit by itself this long before it is killed
_LAUNCHERS = {"node", "deno", "bun", "bunx", "npx", "uvx", "pipx", "uv", "pnpm", "yarn"}
_LOG_LOCK = threading.Lock()


class MCPStartError(RuntimeError):
    """An MCP server could not be started or listed; the message names the server, what it printed and why."""


def resolve_executable(command: Sequence[str]) -> list[str]:
    """`command` with a bare executable name looked up in the running interpreter's environment first
    (the directory of `sys.executable`: a venv's bin, where `pip install mcp-server-time` puts its
    script even when that venv is not activated), then on PATH as the spawn would. Paths are kept."""
    argv = list(command)
    if argv and os.sep not in argv[0] and not (os.altsep and os.altsep in argv[0]):
        local = shutil.which(argv[0], path=os.path.dirname(sys.executable))
        if local:
            argv[0] = local
    return argv


def server_environment(granted: Sequence[str] = (), extra: dict[str, str] | None = None) -> dict[str, str]:
    """A server's whole environment: BASE_ENV and the `granted` names, copied from ours where set (shell
    functions, values starting with "()", are left out), then `extra` (values given in code)."""
    env = {k: v for k in (*BASE_ENV, *granted) if (v := os.environ.get(k)) is not None and not v.startswith("()")}
    return {**env, **(extra or {})}


def wire_limit(max_result_chars: int) -> int:
    """The longest JSON-RPC line a server may send (characters), from the answer cap (see WIRE_FACTOR)."""
    return WIRE_MAX_CHARS if max_result_chars <= 0 else max(WIRE_MIN_CHARS, WIRE_FACTOR * max_result_chars)


def server_name(command: Sequence[str]) -> str:
    """A server's name from its argv: the executable's name; for an interpreter or launcher (python, node,
    npx, uvx, ...) the module, script or package it runs (`python -m mcp_server_time` -> mcp_server_time,
    `uvx mcp-server-git --repository x` -> mcp-server-git)."""
    exe = os.path.basename(command[0])
    stem = re.sub(r"\.(exe|py|js|mjs|cjs|ts)$", "", exe)
    if not (re.fullmatch(r"python[0-9.]*", stem) or stem in _LAUNCHERS):
        return stem or exe
    args = list(command[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if stem.startswith("python") and a == "-m" and i + 1 < len(args):
            return args[i + 1]
        if stem.startswith("python") and a == "-c":
            return stem
        if stem == "uv" and a in ("run", "tool", "--from", "--with", "-p", "--python", "--directory"):
            i += 1 if a in ("run", "tool") else 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        name = re.sub(r"@[^/]*$", "", a) if not a.startswith("@") or a.count("@") > 1 else a
        return re.sub(r"\.(py|js|mjs|cjs|ts)$", "", os.path.basename(name.rstrip("/"))) or stem
    return stem


def tool_error_code(message: str) -> ErrorCode:
    """The ErrorCode a tool's own error text names (MCP servers report errors as text, without a code).

    Argument problems (schema validation, a missing, ill-typed or invalid argument) are INVALID_ARGUMENTS; network
    and transport failures inside the tool are INFRA (TIMEOUT for a timeout): the world's fault; a refused
    address or access is PERMISSION_DENIED; a missing item NOT_FOUND; a rate limit RATE_LIMITED. Anything
    else is PRECONDITION_FAILED: the tool could not do it, for the reason its message gives.
    """
    m = message.lower()
    if any(k in m for k in ("timed out", "timeout", "time out")):
        return ErrorCode.TIMEOUT
    if any(k in m for k in ("connection issue", "connection refused", "connection reset", "connection aborted",
                            "connecterror", "network is unreachable", "name or service not known",
                            "temporary failure in name resolution", "nodename nor servname", "no route to host",
                            "failed to establish a new connection", "remote end closed", "broken pipe")):
        return ErrorCode.INFRA
    if any(k in m for k in ("rate limit", "too many requests", "status code 429", " 429 ")):
        return ErrorCode.RATE_LIMITED
    if any(k in m for k in ("validation error", "field required", "missing required", "required property",
                            "invalid argument", "invalid params", "input should be", "unexpected keyword argument",
                            "missing 1 required", "is a required property", "[type=")):
        return ErrorCode.INVALID_ARGUMENTS
    if any(k in m for k in ("permission denied", "forbidden", "not allowed", "access denied", "refused to",
                            "status code 401", "status code 403", "unauthorized")):
        return ErrorCode.PERMISSION_DENIED
    if any(k in m for k in ("not found", "no such", "does not exist", "status code 404", "unknown revision")):
        return ErrorCode.NOT_FOUND
    if re.search(r"\binvalid\b|\bmust be\b|\bexpected\b.*\bgot\b|\bsyntax\b", m):  # a value the tool refuses
        return ErrorCode.INVALID_ARGUMENTS
    return ErrorCode.PRECONDITION_FAILED


_HINTS = {
    ErrorCode.INVALID_ARGUMENTS: "fix the arguments named in the message (the tool's schema is in its description)",
    ErrorCode.INFRA: "the tool could not reach what it needed (not your fault); try later or another tool",
    ErrorCode.TIMEOUT: "the tool did not finish in time; repeat the call once",
    ErrorCode.PERMISSION_DENIED: "the tool may not do this; choose another target or tool",
    ErrorCode.NOT_FOUND: "check the name or id against what the tools have returned",
    ErrorCode.RATE_LIMITED: "too many calls: repeat the same call once",
    ErrorCode.PRECONDITION_FAILED: "the tool could not do it: read its message and change the call",
}


def _leaf(e: BaseException) -> BaseException:
    """The first real exception inside (possibly nested) exception groups: what actually failed."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


class _StderrSink:
    """Reads a server's stderr pipe in a thread: every line to the log file (if any), the last ones kept."""

    def __init__(self, fd: int, name: str, log: str) -> None:
        self.name, self.log = name, log
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._file = os.fdopen(fd, "rb", buffering=0)
        self._thread = threading.Thread(target=self._read, name=f"mcp-{name}-stderr", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        out = None
        try:
            if self.log:
                os.makedirs(os.path.dirname(os.path.abspath(self.log)), exist_ok=True)
                out = open(self.log, "a", encoding="utf-8")
            buf = b""
            while True:
                chunk = self._file.read(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                self._emit(lines, out)
            if buf:
                self._emit([buf], out)
        except (OSError, ValueError):
            pass
        finally:
            self._file.close()
            if out is not None:
                out.close()

    def _emit(self, lines: list[bytes], out: Any) -> None:
        texts = [ln.decode("utf-8", errors="replace").rstrip("\r") for ln in lines]
        self.tail.extend(t for t in texts if t.strip())
        if out is not None and texts:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            with _LOG_LOCK:  # several servers may share one run log
                out.write("".join(f"{stamp} mcp:{self.name} | {t}\n" for t in texts))
                out.flush()

    def wait(self, timeout: float) -> None:
        """Let the reader finish what the (exited) process wrote."""
        self._thread.join(timeout)

    def text(self) -> str:
        """The last lines, on one line (` | ` between them), at most 1,000 characters."""
        text = " | ".join(t.strip() for t in self.tail)
        return text if len(text) <= 1000 else "..." + text[-997:]


class MCPServerTools:
    """A tool provider backed by one MCP server process (stdio)."""

    def __init__(self, command: Sequence[str] | MCPServerSpec, allow: set[str] | None = None, timeout_s: float = 20.0,
                 name: str | None = None, env: dict[str, str] | None = None, prefix: str = "",
                 rename: dict[str, str] | None = None, log: str = "",
                 max_result_chars: int = DEFAULT_MAX_RESULT_CHARS) -> None:
        if isinstance(command, MCPServerSpec):
            spec = command
        else:
            if not command:
                raise MCPStartError("empty MCP server command")
            spec = MCPServerSpec(command=list(command), name=name or "", prefix=prefix, rename=dict(rename or {}),
                                 allow=allow, log=log, max_result_chars=max_result_chars)
        self.spec = spec
        self.command = resolve_executable(spec.command)
        self.allow = spec.allow if spec.allow is not None else allow
        self.timeout_s = float(timeout_s)
        self.name = name or spec.name or server_name(self.command)
        self.source = f"mcp:{self.name}"
        self.env = env
        self.max_result_chars = int(spec.max_result_chars)  # enforced in `call` (harness.runtime reads it too)
        self.wire_limit = wire_limit(self.max_result_chars)
        self._overflow = 0  # the length of a line past wire_limit that stopped the server (0: none)
        self.restarts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{self.name}", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._holder: Any = None  # concurrent future of the task that holds the session (`_hold`)
        self._stop: asyncio.Event | None = None
        self._proc: Any = None
        self._stderr: _StderrSink | None = None
        self._specs: list[ToolSpec] = []
        self._own: dict[str, str] = {}  # shown name -> the server's own name (allowed tools)
        self._refused: dict[str, str] = {}  # shown name -> own name (tools off the allow-list)
        try:
            self._start()
        except BaseException:
            self._stop_loop()
            raise

    # ---------------------------------------------------------------- transport
    def _environment(self) -> dict[str, str]:
        return server_environment(self.spec.env, self.env)

    @contextlib.asynccontextmanager
    async def _stdio_transport(self) -> AsyncIterator[tuple[Any, Any]]:
        """Spawn the server and bridge its stdout/stdin lines to the SDK's message streams."""
        import anyio
        import mcp_types
        from anyio.streams.text import TextReceiveStream
        from mcp.shared.message import SessionMessage

        rfd, wfd = os.pipe()
        self._stderr = _StderrSink(rfd, self.name, self.spec.log)
        try:
            proc = await anyio.open_process(self.command, stderr=wfd, env=self._environment(), start_new_session=True)
        finally:
            os.close(wfd)  # the child holds its own copy: EOF on the pipe once the server (and its children) exit
        self._proc = proc
        read_writer, read_stream = anyio.create_memory_object_stream(0)
        write_stream, write_reader = anyio.create_memory_object_stream(0)

        async def stdout_reader() -> None:
            buf = ""
            try:
                async with read_writer:
                    async for chunk in TextReceiveStream(proc.stdout, encoding="utf-8", errors="replace"):
                        *lines, buf = (buf + chunk).split("\n")
                        longest = max([len(buf), *map(len, lines)])
                        if longest > self.wire_limit:  # stop it now: the rest of the line never reaches memory
                            self._overflow = longest
                            with contextlib.suppress(OSError):
                                os.killpg(proc.pid, signal.SIGKILL)
                            return
                        for line in lines:
                            if not line.strip():
                                continue
                            try:
                                item: Any = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                            except ValueError as e:  # not JSON-RPC: the session reports it for that request
                                item = e
                            await read_writer.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                pass

        async def stdin_writer() -> None:
            try:
                async with write_reader:
                    async for message in write_reader:
                        data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await proc.stdin.send(data.encode("utf-8"))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_writer.aclose()  # the server stopped reading: end the session's pending requests

        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stdin_writer)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):  # the process must be gone whatever cancelled us
                    await _stop_process(proc)
                tg.cancel_scope.cancel()

    def _kill_now(self) -> None:
        """SIGKILL the server's process group from the calling thread (a hung server; the loop may be stuck)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

    # ---------------------------------------------------------------- lifecycle
    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout or self.timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise TimeoutError(f"no answer within {timeout or self.timeout_s:g} s") from None

    async def _hold(self, ready: "asyncio.Future[list[Any]]", stop: asyncio.Event) -> None:
        """Open the session, list the tools (-> `ready`), keep the session until `stop`, then close it: one
        task from start to end, because the SDK's anyio scopes must be left by the task that entered them."""
        from mcp import Client

        client = None
        try:
            async with Client(self._stdio_transport(), mode="legacy", cache=None) as client:
                res = await client.list_tools()
                self._session = client
                ready.set_result(list(res.tools))
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported through `ready` while starting, else by the call
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(f"start cancelled: {e!r}"))
        finally:
            if self._session is client:  # never the session of a server started after this one
                self._session = None

    async def _begin(self) -> "asyncio.Future[list[Any]]":
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._holder = asyncio.ensure_future(self._hold(ready, self._stop))
        return ready

    def _open(self) -> list[Any]:
        """Start the server and its session; the listed tools. TimeoutError past `timeout_s`."""
        ready = self._run(self._begin(), timeout=self.timeout_s)  # spawning itself can be slow on a loaded host
        waiter = asyncio.run_coroutine_threadsafe(_wait(ready), self._loop)
        try:
            return waiter.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"no answer within {self.timeout_s:g} s") from None

    def _shutdown(self) -> None:
        """End the session's task and make sure the process is gone (killed if closing did not end it)."""
        holder, stop, self._holder, self._stop = self._holder, self._stop, None, None
        if holder is not None and stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
            done = asyncio.run_coroutine_threadsafe(_wait(holder), self._loop)
            try:
                done.result(timeout=_GRACE_S + 6)
            except BaseException:  # noqa: BLE001 - a session that does not close: killed below, then cancelled
                self._kill_now()
                self._loop.call_soon_threadsafe(holder.cancel)
                with contextlib.suppress(BaseException):
                    asyncio.run_coroutine_threadsafe(_wait(holder), self._loop).result(timeout=5)
        self._session = None
        self._kill_now()
        if self._stderr is not None:
            self._stderr.wait(2.0)

    def _exit_code(self) -> int | None:
        """The server's exit code (None while it runs); waits briefly for the loop to reap an exited one."""
        proc = self._proc
        if proc is None:
            return None
        for _ in range(200):
            if proc.returncode is not None:
                break
            time.sleep(0.01)
        return proc.returncode

    def _printed(self) -> str:
        """'; its stderr ends: ...' with the server's last stderr lines (or that it printed none)."""
        if self._stderr is not None:
            self._stderr.wait(2.0)
        printed = self._stderr.text() if self._stderr is not None else ""
        log = f" (all of it in {self.spec.log})" if self.spec.log else ""
        return f"; its stderr ends: {printed}{log}" if printed else "; it printed nothing on stderr"

    def _start(self) -> None:
        what = f"MCP server {self.name} ({' '.join(self.command)!r})"
        self._proc = self._stderr = None
        self._overflow = 0
        try:
            tools = self._open()
        except TimeoutError:
            self._kill_now()  # hung at start: killed now, not left running
            self._shutdown()
            raise MCPStartError(f"{what} did not answer the MCP handshake within {self.timeout_s:g} s"
                                f" (config.harness.mcp_timeout_s) and was killed{self._printed()}") from None
        except Exception as e:  # noqa: BLE001 - spawn failure, early exit, protocol error
            leaf = _leaf(e)
            self._shutdown()
            if isinstance(leaf, (FileNotFoundError, PermissionError)) and self._proc is None:
                raise MCPStartError(f"{what} cannot be started: {leaf.strerror or leaf}: {self.command[0]!r}") from None
            code = self._exit_code()
            if code is not None and code >= 0:  # it exited by itself before answering
                raise MCPStartError(f"{what} exited with code {code} at start{self._printed()}") from None
            raise MCPStartError(f"{what} did not start ({type(leaf).__name__}: {leaf}){self._printed()}") from None
        specs, own, refused = [], {}, {}
        listed = {t.name for t in tools}
        missing = sorted(set(self.spec.rename) - listed)
        if missing:
            self._shutdown()
            raise MCPStartError(f"{what}: rename names {missing[0]!r}, which the server does not list"
                                f" (its tools: {', '.join(sorted(listed))})")
        for t in tools:
            shown = self.spec.shown_name(t.name)
            if not TOOL_NAME.match(shown):
                self._shutdown()
                raise MCPStartError(f"{what}: tool name {shown!r} is not 1-64 letters, digits, '_' or '-':"
                                    " rename it (harness.mcp entry rename=OLD:NEW)")
            if shown in own or shown in refused:
                self._shutdown()
                raise MCPStartError(f"{what}: two tools would be shown as {shown!r}: rename one")
            if self.allow is not None and t.name not in self.allow and shown not in self.allow:
                refused[shown] = t.name
                continue
            schema = dict(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {"type": "object"})
            schema.pop("title", None)
            own[shown] = t.name
            specs.append(ToolSpec(name=shown, app=self.source, domain="utilities", description=t.description or t.name,
                                  parameters=schema, kind="write"))
        self._specs, self._own, self._refused = specs, own, refused

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def refused(self) -> list[str]:
        """Shown names of the server's tools that the allow-list leaves out (calls answer PERMISSION_DENIED)."""
        return sorted(self._refused)

    def stderr_tail(self) -> str:
        """The last lines the server printed on stderr."""
        return self._stderr.text() if self._stderr is not None else ""

    @property
    def pid(self) -> int | None:
        """The running server's process id (None before it started)."""
        return None if self._proc is None else self._proc.pid

    def restart(self) -> None:
        """Stop the server process (if any is left) and start a fresh one."""
        self._shutdown()
        self.restarts += 1
        self._start()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def close(self) -> None:
        self._shutdown()
        self._stop_loop()

    # ---------------------------------------------------------------- calls
    def call(self, name: str, args: dict[str, Any], call_id: str = "") -> Feedback:
        """Call a tool by its shown name; a dead or hung server gives INFRA/TIMEOUT Feedback and is restarted."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND

        if name in self._refused:
            return Feedback.error(ErrorCode.PERMISSION_DENIED, f"MCP tool {name!r} of {self.source} is not on the allow-list",
                                  call_id, "allowed: " + (", ".join(sorted(self._own)) or "none"))
        own = self._own.get(name)
        if own is None:
            return Feedback.error(ErrorCode.UNKNOWN_TOOL, f"{self.source} has no tool {name!r}", call_id,
                                  "its tools: " + ", ".join(sorted(self._own)))
        if self._session is None:
            try:
                self.restart()
            except MCPStartError as e:
                return Feedback.error(ErrorCode.INFRA, str(e), call_id, "the tool server is down; try later or another tool")
        try:
            res = self._run(self._session.call_tool(own, args))
        except TimeoutError as e:
            self._kill_now()  # hung: killed now; the next call starts a fresh server
            self._shutdown()
            return Feedback.error(ErrorCode.TIMEOUT, f"MCP server {self.name}: {e}", call_id, "retry the call once")
        except MCPError as e:
            if e.code != CONNECTION_CLOSED:  # the server is alive and answered with a JSON-RPC error
                code = (ErrorCode.INVALID_ARGUMENTS if e.code == INVALID_PARAMS and "unknown tool" not in e.message.lower()
                        else ErrorCode.UNKNOWN_TOOL if e.code == METHOD_NOT_FOUND or "unknown tool" in e.message.lower()
                        else tool_error_code(e.message))
                return Feedback.error(code, f"MCP server {self.name}: {e.message}", call_id, _HINTS.get(code, ""))
            return self._transport_failure(e, call_id)
        except Exception as e:  # noqa: BLE001 - the server died or broke the protocol
            return self._transport_failure(e, call_id)
        text = "\n".join(getattr(c, "text", "") for c in (res.content or []) if getattr(c, "text", None) is not None)
        if res.is_error:
            message = text or "the tool reported an error without a message"
            code = tool_error_code(message)
            return cap_result(Feedback.error(code, message, call_id, _HINTS.get(code, "")), self.max_result_chars)
        result = res.structured_content if res.structured_content is not None else text
        if isinstance(result, dict) and set(result) == {"result"}:
            result = result["result"]
        return cap_result(Feedback(call_id=call_id, status="ok", result=result), self.max_result_chars)

    def _transport_failure(self, e: BaseException, call_id: str) -> Feedback:
        """INFRA Feedback for a server that died or broke the protocol mid-call; it is started again."""
        leaf = _leaf(e)
        self._shutdown()
        code = self._exit_code()
        what = f"exited with code {code} during the call" if code is not None and code >= 0 else \
            f"failed during the call ({type(leaf).__name__}: {leaf})"
        if self._overflow:
            what = (f"sent a message of over {self._overflow:,} characters, past the limit of {self.wire_limit:,}"
                    f" ({WIRE_FACTOR} x harness.max_result_chars), and was stopped")
        message = f"MCP server {self.name} {what}{self._printed()}"
        try:
            self.restart()
            note = "the server was restarted; retry the call"
        except MCPStartError as e2:
            note = f"restart failed: {e2}"
        return Feedback.error(ErrorCode.INFRA, message, call_id, note)


async def _wait(fut: Any) -> Any:
    """Await a future or task without cancelling it when the waiter is cancelled (a timeout of the caller)."""
    return await asyncio.shield(fut)


async def _stop_process(proc: Any) -> None:
    """Close stdin, give the server `_GRACE_S` to exit, then SIGTERM and SIGKILL its process group."""
    import anyio

    with contextlib.suppress(Exception):
        await proc.stdin.aclose()
    for sig, wait_s in ((None, _GRACE_S), (signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0)):
        if sig is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while proc.returncode is None and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        if proc.returncode is not None:
            break
    with contextlib.suppress(Exception):
        await proc.stdout.aclose()


def start_servers(servers: Sequence[Sequence[str] | MCPServerSpec], allow: set[str] | None = None,
                  timeout_s: float = 20.0) -> list[MCPServerTools]:
    """Start every server (specs, or plain argvs); if one fails, the ones already started are closed and the
    error is raised. Two servers with one name get `-2`, `-3`, ... so that their sources stay apart."""
    out: list[MCPServerTools] = []
    seen: collections.Counter[str] = collections.Counter()
    try:
        for entry in servers:
            spec = entry if isinstance(entry, MCPServerSpec) else MCPServerSpec(command=list(entry))
            base = spec.name or server_name(spec.command)
            seen[base] += 1
            name = base if seen[base] == 1 else f"{base}-{seen[base]}"
            out.append(MCPServerTools(spec, allow=allow, timeout_s=timeout_s, name=name))
    except Exception:
        for s in out:
            s.close()
        raise
    return out
