"""What `mpa serve` checks before a request reaches its route: the API key, admission, the body size.

One ASGI middleware (`Guard`), in this order:

1. Declared body size: a `Content-Length` above `max_body_bytes` is a 413 before any byte of the body
   is read (and the connection is closed).
2. API key (when one is set): `Authorization: Bearer KEY` on every route but `/health` (and CORS
   preflights), compared in constant time, as SGLang's and vLLM's `--api-key`; else 401.
3. Admission (generation routes: `/generate`, `/v1/chat/completions`, `/v1/completions`): at most
   `max_concurrent_requests` are answered at once and `max_queued_requests` wait for a turn; one more
   is a 429 with `Retry-After`. A request holds its turn until its response (stream included) ends.
   Admission comes before the body is read, so bodies in memory are bounded by the running requests.
4. A body without `Content-Length` (chunked) is kept up to the limit; past it nothing more is kept,
   the rest is drained (up to 16x the limit, so the client can read the answer) and the answer is 413.

Each refusal is one JSON line in OpenAI's error shape (`{"error": {"message", "type", "code", "param"}}`).
A 401 or 429 first reads and drops the (bounded) body, so a keep-alive connection stays in step.
Limits on prompt characters and tokens are checked in the routes (`Limits`, after parsing).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from typing import Any, Awaitable, Callable

GENERATION_PATHS = frozenset({"/generate", "/v1/chat/completions", "/v1/completions"})
OPEN_PATHS = frozenset({"/health"})  # answered without the API key (liveness probes)
LINGER_FACTOR = 16  # a chunked body over the limit is drained (not kept) up to this many times the limit


@dataclasses.dataclass(frozen=True)
class Limits:
    """Request limits of `mpa serve` (the keys of config.serve of the same names)."""

    max_body_bytes: int
    max_prompt_chars: int
    max_prompt_tokens: int
    max_concurrent_requests: int
    max_queued_requests: int

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "max_queued_requests" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"config.serve.{f.name} must be an integer >= {low}, got {value!r}")

    @classmethod
    def from_config(cls, serve: Any) -> "Limits":
        """From the `serve` section of a config."""
        return cls(**{f.name: serve[f.name] for f in dataclasses.fields(cls)})


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """An OpenAI-shaped error as one JSON line."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
            413: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    err: dict[str, Any] = {"message": message, "type": kind, "code": status, "param": param}
    if param is not None:
        err["field"] = param
    return json.dumps({"error": err}).encode()


async def send_error(send: Callable[[dict[str, Any]], Awaitable[None]], status: int, message: str,
                     param: str | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = error_body(status, message, param)
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Admission:
    """Turns for generation requests: `running` at most `max_running`, `waiting` at most `max_waiting`.

    Single event loop: plain integers and one semaphore suffice (the semaphore binds to the loop that
    first waits on it).
    """

    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self.waiting = 0
        self._sem = asyncio.Semaphore(max_running)

    def full(self) -> bool:
        return self.running + self.waiting >= self.max_running + self.max_waiting

    async def enter(self) -> None:
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def leave(self) -> None:
        self.running -= 1
        self._sem.release()


class Guard:
    """The ASGI middleware described in the module docstring."""

    def __init__(self, app: Any, api_key: str, limits: Limits, admission: Admission) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else b""
        self.limits = limits
        self.admission = admission

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self.key)
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        limit = self.limits.max_body_bytes
        length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if length is not None:  # declared: refused before anything else, without reading a byte
            try:
                declared = int(length)
            except ValueError:
                await send_error(send, 400, "Content-Length is not a number", "content-length", [(b"connection", b"close")])
                return
            if declared > limit:  # the connection is closed after the answer: the body is never read
                await send_error(send, 413, f"request body larger than serve.max_body_bytes ({limit} bytes):"
                                 f" Content-Length {declared}", "body", [(b"connection", b"close")])
                return
        if self.key and path not in OPEN_PATHS and method != "OPTIONS" and not self._authorized(scope):
            await self._refuse(receive, send, 401, "missing or wrong API key: send the header `Authorization: Bearer KEY`",
                               "authorization", [(b"www-authenticate", b"Bearer")])
            return
        gated = method == "POST" and path in GENERATION_PATHS
        if gated:
            if self.admission.full():
                a = self.admission
                await self._refuse(receive, send, 429, f"server busy: {a.running} requests running and {a.waiting} queued"
                                   f" (serve.max_concurrent_requests={a.max_running}, serve.max_queued_requests="
                                   f"{a.max_waiting}); retry later", None, [(b"retry-after", b"1")])
                return
            await self.admission.enter()
        try:
            if length is not None or method in ("GET", "HEAD", "OPTIONS"):
                await self.app(scope, receive, send)
            else:
                await self._chunked(scope, receive, send)
        finally:
            if gated:
                self.admission.leave()

    async def _refuse(self, receive: Any, send: Any, status: int, message: str, param: str | None,
                      headers: list[tuple[bytes, bytes]]) -> None:
        """An early answer. The request's body (at most the limit when declared, else up to LINGER_FACTOR
        times it) is read and dropped first, so the connection stays usable for the client's next
        request; a body that does not end there gets the connection closed."""
        complete = await self._drain(receive, LINGER_FACTOR * self.limits.max_body_bytes)
        await send_error(send, status, message, param, headers + ([] if complete else [(b"connection", b"close")]))

    @staticmethod
    async def _drain(receive: Any, cap: int) -> bool:
        """Read and drop the request body, up to `cap` bytes; True when it ended within them."""
        size = 0
        while size <= cap:
            message = await receive()
            if message["type"] != "http.request":
                return False
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False

    async def _chunked(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A body without Content-Length: read here up to the limit (413 the moment it passes), then
        handed to the app whole."""
        limit = self.limits.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > limit:
                # Past the limit nothing more is kept. The rest (up to LINGER_FACTOR times the limit) is
                # read and dropped first, so that a client still writing its body is not cut off and
                # reads the 413; beyond that the connection is closed.
                chunks.clear()
                complete = not more or await self._drain(receive, LINGER_FACTOR * limit - size)
                await send_error(send, 413, f"request body larger than serve.max_body_bytes ({limit} bytes)", "body",
                                 [] if complete else [(b"connection", b"close")])
                return
            chunks.append(message.get("body", b""))
            if not more:
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
