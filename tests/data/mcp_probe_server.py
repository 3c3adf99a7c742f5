"""A real MCP server (official `mcp` SDK, stdio) that probes what the harness lets a server reach.

Tools: `getenv(name)` (the variable's value or "<unset>"), `environ()` (the names of every variable it
sees), `ids()` (its pid, parent pid and process group), `big(n)` (n characters) and `hang()` (never answers).
"""
import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("probe")


@server.tool()
def getenv(name: str) -> str:
    """An environment variable of this server process."""
    return os.environ.get(name, "<unset>")


@server.tool()
def environ() -> list[str]:
    """The names of every environment variable this server process sees."""
    return sorted(os.environ)


@server.tool()
def ids() -> dict:
    """This process' pid, parent pid and process group."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0)}


@server.tool()
def big(n: int) -> str:
    """n characters of text."""
    return "x" * n


@server.tool()
def hang() -> str:
    """Never answers (the client's timeout must end the call)."""
    while True:
        time.sleep(60)


if __name__ == "__main__":
    server.run("stdio")
