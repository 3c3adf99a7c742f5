"""An emulated Android device on 127.0.0.1 that speaks the adbd wire protocol (no auth, no TLS).

Packets are 24-byte little-endian headers (command, arg0, arg1, data length, data checksum, magic) plus
data. The adb server opens the transport with CNXN; each `adb shell` / adbutils `shell()` is a stream:
OPEN("shell:CMD") -> OKAY -> WRTE(output) ... (each WRTE waits for the peer's OKAY) -> CLSE. Commands run
in a thread per stream against one `DeviceShell`, so a slow command does not stall the transport.
`adb connect 127.0.0.1:PORT` reaches it like a phone with wireless debugging on.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import Any

from mpa_jax.envs.adb.device import PROPS, DeviceShell

A_CNXN, A_OPEN, A_OKAY, A_WRTE, A_CLSE, A_AUTH = (0x4E584E43, 0x4E45504F, 0x59414B4F, 0x45545257, 0x45534C43, 0x48545541)
A_VERSION = 0x01000001
MAX_PAYLOAD = 1024 * 1024
_HEADER = struct.Struct("<6I")


def pack(cmd: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    """One adb packet."""
    return _HEADER.pack(cmd, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, cmd ^ 0xFFFFFFFF) + data


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def read_packet(sock: socket.socket) -> tuple[int, int, int, bytes]:
    """(command, arg0, arg1, data); raises ConnectionError on a bad magic or a closed peer."""
    cmd, a0, a1, length, _check, magic = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if magic != cmd ^ 0xFFFFFFFF:
        raise ConnectionError(f"bad packet magic for command {cmd:#x}")
    if length > MAX_PAYLOAD:
        raise ConnectionError(f"packet of {length} bytes exceeds {MAX_PAYLOAD}")
    return cmd, a0, a1, _recv_exact(sock, length) if length else b""


class _Transport:
    """One adb server connection: the packet loop and its streams."""

    def __init__(self, device: "EmulatedDevice", sock: socket.socket) -> None:
        self.device, self.sock = device, sock
        self.send_lock = threading.Lock()
        self.next_id = 1
        self.acks: dict[int, threading.Semaphore] = {}  # local stream id -> OKAYs received
        self.closed: set[int] = set()
        self.max_data = 4096

    def send(self, cmd: int, a0: int, a1: int, data: bytes = b"") -> None:
        with self.send_lock:
            self.sock.sendall(pack(cmd, a0, a1, data))

    def serve(self) -> None:
        try:
            while not self.device.stopping.is_set():
                cmd, a0, a1, data = read_packet(self.sock)
                if cmd == A_CNXN:
                    self.max_data = min(a1 or 4096, MAX_PAYLOAD)
                    props = ";".join(f"{k}={PROPS[k]}" for k in ("ro.product.name", "ro.product.model", "ro.product.device"))
                    self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, f"device::{props};features=cmd".encode())
                elif cmd == A_OPEN:
                    local = self.next_id
                    self.next_id += 1
                    self.acks[local] = threading.Semaphore(0)
                    service = data.rstrip(b"\x00").decode("utf-8", "replace")
                    threading.Thread(target=self._stream, args=(local, a0, service), daemon=True).start()
                elif cmd == A_OKAY:
                    sem = self.acks.get(a1)
                    if sem is not None:
                        sem.release()
                elif cmd == A_CLSE:
                    self.closed.add(a1)
                    sem = self.acks.get(a1)
                    if sem is not None:
                        sem.release()
                elif cmd == A_WRTE:
                    self.send(A_OKAY, a1, a0)  # stdin of a shell stream is ignored, but must be acknowledged
                # AUTH and anything else: ignored (no authentication on the emulated device)
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def _stream(self, local: int, remote: int, service: str) -> None:
        try:
            if not service.startswith("shell:"):
                self.send(A_CLSE, 0, remote)  # unsupported service: refuse the OPEN
                return
            self.send(A_OKAY, local, remote)
            out, _status = self.device.shell.run(service[len("shell:"):])
            payload = out.encode("utf-8")
            for i in range(0, len(payload), self.max_data):
                if local in self.closed:
                    return
                self.send(A_WRTE, local, remote, payload[i:i + self.max_data])
                if not self.acks[local].acquire(timeout=30):
                    return
            self.send(A_CLSE, local, remote)
        except (ConnectionError, OSError):
            pass
        finally:
            self.acks.pop(local, None)


class EmulatedDevice:
    """`EmulatedDevice(port).start()` serves on 127.0.0.1:port (0 = a free port) until `stop()`."""

    def __init__(self, port: int = 0, shell: DeviceShell | None = None) -> None:
        self.shell = shell or DeviceShell()
        self.stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._thread: threading.Thread | None = None

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "EmulatedDevice":
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.append(sock)
            threading.Thread(target=_Transport(self, sock).serve, daemon=True).start()

    def drop_connections(self) -> None:
        """Cut every adb server connection (a cable pull / Wi-Fi drop); the listener stays up."""
        for s in self._conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self._conns.clear()

    def stop(self) -> None:
        """Close the listener and every connection; the port is free again when this returns."""
        self.stopping.set()
        try:
            # shutdown wakes the accept thread: a bare close() leaves the kernel socket (and the port) held
            # by the blocked accept, so a device restarted on the same port could not bind
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.drop_connections()
        self.shell.close()

    def __enter__(self) -> "EmulatedDevice":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(port: int) -> None:
    """`mpa device emulate`: serve until interrupted."""
    dev = EmulatedDevice(port).start()
    print(f"emulated device listening on {dev.serial} (adb connect {dev.serial})", flush=True)
    try:
        dev.stopping.wait()
    except KeyboardInterrupt:
        pass
    finally:
        dev.stop()
