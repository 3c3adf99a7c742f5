"""Running the `mpa serve` app: on a background thread (tests, demos) or in the foreground (the CLI)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable


class ServerThread:
    """A uvicorn server on a background thread (tests, in-process demos). `port=0` picks a free port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.host = host
        self._thread = threading.Thread(target=self.server.run, name="mpa-serve", daemon=True)

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("mpa serve: the HTTP server did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(app: Any, host: str, port: int, on_start: Callable[[str], None] | None = None) -> None:
    """Run uvicorn in the foreground until interrupted. The socket is bound here first, so that
    `on_start` gets the real address (with `port=0`, the port the system picked)."""
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    real = sock.getsockname()[1]
    if on_start is not None:
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        on_start(f"http://{shown}:{real}")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=real, log_level="info", lifespan="on"))
    server.run(sockets=[sock])
