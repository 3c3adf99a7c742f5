"""A small real MCP server (official `mcp` SDK, stdio transport) for the harness tests.

Tools: `add(a, b)`, `echo(text)`, `crash()` (exits the process with code 3: the client must see INFRA and
restart the server) and `pid()` (the server's process id, to tell a restarted server from the first one).
It prints one line on stderr when it starts (the harness must capture it to the run's log).
"""
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Repeat the text back."""
    return text


@server.tool()
def crash() -> str:
    """Kill this server process (tests the client's restart)."""
    os._exit(3)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    print(f"mcp_calc_server {os.getpid()} ready", file=sys.stderr, flush=True)
    server.run("stdio")
