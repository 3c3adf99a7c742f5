"""MCP servers as tool providers, through the official `mcp` SDK over stdio.

Each server is a subprocess started from a command (never through a shell). One background thread runs
an asyncio loop that owns the SDK client session; the runtime calls synchronously. Listing and calls
have a timeout. A server that dies (or times out) answers that call with INFRA Feedback and is started
again on the next call, so one crashed server never ends the episode loop. An allow-list limits which
of a server's tools the planner sees and may call.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Sequence

from mpa_jax.envs.contract import ErrorCode, Feedback, ToolSpec


class MCPStartError(RuntimeError):
    """An MCP server could not be started or listed; the message names the command."""


class MCPServerTools:
    """A tool provider backed by one MCP server process (stdio)."""

    def __init__(self, command: Sequence[str], allow: set[str] | None = None, timeout_s: float = 20.0,
                 name: str | None = None, env: dict[str, str] | None = None) -> None:
        if not command:
            raise MCPStartError("empty MCP server command")
        self.command = list(command)
        self.allow = allow
        self.timeout_s = float(timeout_s)
        self.name = name or os.path.splitext(os.path.basename(self.command[-1] if len(self.command) > 1 else self.command[0]))[0]
        self.source = f"mcp:{self.name}"
        self.env = env
        self.restarts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{self.name}", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stack: Any = None
        self._specs: list[ToolSpec] = []
        self._start()

    # ---------------------------------------------------------------- lifecycle
    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout or self.timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise TimeoutError(f"no answer within {timeout or self.timeout_s:.0f} s") from None

    async def _open(self) -> list[Any]:
        from contextlib import AsyncExitStack

        from mcp import Client, StdioServerParameters

        stack = AsyncExitStack()
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env)
        devnull = open(os.devnull, "w")  # the server's stderr (logs) is not ours to print
        stack.callback(devnull.close)
        client = await stack.enter_async_context(Client(params, mode="legacy", errlog=devnull)) if _accepts_errlog() \
            else await stack.enter_async_context(Client(params, mode="legacy"))
        self._stack, self._session = stack, client
        res = await client.list_tools()
        return list(res.tools)

    async def _close(self) -> None:
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            try:
                await stack.aclose()
            except BaseException:  # noqa: BLE001 - a dead server's pipes may already be gone
                pass

    def _start(self) -> None:
        try:
            tools = self._run(self._open())
        except Exception as e:  # noqa: BLE001
            try:
                self._run(self._close(), timeout=5)
            except Exception:  # noqa: BLE001
                pass
            raise MCPStartError(f"MCP server {' '.join(self.command)!r} did not start: {type(e).__name__}: {e}") from None
        specs = []
        for t in tools:
            if self.allow is not None and t.name not in self.allow:
                continue
            schema = dict(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {"type": "object"})
            schema.pop("title", None)
            specs.append(ToolSpec(name=t.name, app=self.source, domain="utilities", description=t.description or t.name,
                                  parameters=schema, kind="write"))
        self._specs = specs

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def restart(self) -> None:
        """Stop the server process (if any is left) and start a fresh one."""
        try:
            self._run(self._close(), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self.restarts += 1
        self._start()

    def close(self) -> None:
        try:
            self._run(self._close(), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ---------------------------------------------------------------- calls
    def call(self, name: str, args: dict[str, Any], call_id: str = "") -> Feedback:
        """Call a tool; a dead or hung server gives INFRA/TIMEOUT Feedback and is restarted for the next call."""
        if self.allow is not None and name not in self.allow:
            return Feedback.error(ErrorCode.PERMISSION_DENIED, f"MCP tool {name!r} is not on the allow-list", call_id,
                                  "allowed: " + ", ".join(sorted(self.allow)))
        if self._session is None:
            try:
                self.restart()
            except MCPStartError as e:
                return Feedback.error(ErrorCode.INFRA, str(e), call_id, "the tool server is down; try later or another tool")
        try:
            res = self._run(self._session.call_tool(name, args))
        except TimeoutError as e:
            self._session = None  # a hung server is replaced on the next call
            return Feedback.error(ErrorCode.TIMEOUT, f"MCP server {self.name}: {e}", call_id, "retry the call once")
        except Exception as e:  # noqa: BLE001 - the server died or broke the protocol
            self._session = None
            try:
                self.restart()
                note = "the server was restarted; retry the call"
            except MCPStartError as e2:
                note = f"restart failed: {e2}"
            return Feedback.error(ErrorCode.INFRA, f"MCP server {self.name} failed: {type(e).__name__}: {e}", call_id, note)
        text = "\n".join(getattr(c, "text", "") for c in (res.content or []) if getattr(c, "text", None) is not None)
        if res.is_error:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, text or "the tool reported an error", call_id,
                                  "check the arguments against the tool's schema")
        result = res.structured_content if res.structured_content is not None else text
        if isinstance(result, dict) and set(result) == {"result"}:
            result = result["result"]
        return Feedback(call_id=call_id, status="ok", result=result)


_ERRLOG: bool | None = None


def _accepts_errlog() -> bool:
    """Whether this SDK's Client takes `errlog` (newer ones do; older ones print server stderr)."""
    global _ERRLOG
    if _ERRLOG is None:
        import dataclasses

        from mcp import Client

        _ERRLOG = any(f.name == "errlog" for f in dataclasses.fields(Client))
    return _ERRLOG


def start_servers(commands: Sequence[Sequence[str]], allow: set[str] | None = None, timeout_s: float = 20.0) -> list[MCPServerTools]:
    """Start every server; if one fails, the ones already started are closed and the error is raised."""
    out: list[MCPServerTools] = []
    try:
        for cmd in commands:
            out.append(MCPServerTools(cmd, allow=allow, timeout_s=timeout_s))
    except Exception:
        for s in out:
            s.close()
        raise
    return out
