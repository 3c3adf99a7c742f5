"""The real adb server (Debian's `adb`) on a private port: for tests, benches and `mpa device`."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adb_binary() -> str:
    """Path of the `adb` executable; a clear error when the Debian package is missing."""
    path = shutil.which("adb")
    if path is None:
        raise FileNotFoundError("`adb` is not installed (Debian: apt-get install -y adb; `make test` does this)")
    return path


class AdbServer:
    """`with AdbServer() as srv:` runs `adb -P PORT start-server` and kills that server on exit."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.adb = adb_binary()

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`adb -P PORT ARGS...` (never through a shell)."""
        env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(self.port))
        return subprocess.run([self.adb, "-P", str(self.port), *args], capture_output=True, text=True, timeout=timeout, env=env)

    def start(self) -> "AdbServer":
        res = self.run("start-server")
        if res.returncode != 0:
            raise RuntimeError(f"adb start-server on port {self.port} failed: {res.stderr.strip()}")
        return self

    def connect(self, serial: str) -> None:
        res = self.run("connect", serial)
        if "connected to" not in res.stdout:
            raise RuntimeError(f"adb connect {serial} failed: {(res.stdout + res.stderr).strip()}")

    def kill(self) -> None:
        self.run("kill-server")

    def __enter__(self) -> "AdbServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()
