"""The SGLang fleet as the client manages it: workers in rotation, routing to them, rolling weight sync.

`Fleet` is the half of `sglang.SGLangEngine` that knows about several servers (the module docstring of
`mpa_jax.rollout.sglang` describes the modes and the sync protocol): picking a worker (`_pick`), learning
workers from sglang-router (`_router_workers`, `_sync_targets`), taking a failing worker out of rotation
and bringing it back, auditing weight versions, and `update_weights` (export once, load on every worker,
flush, check). The HTTP transport (`_request`, `_client`, `_run`) and generation live in the client.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from mpa_jax.rollout.types import EngineError

_log = logging.getLogger("mpa_jax.rollout.sglang")

def version_accepted(got: str, expected: str, max_staleness: int = 0) -> bool:
    """Whether a result sampled with weights `got` may join a step that expects `expected`.

    No expectation yet (`expected == ""`, nothing synced) accepts anything. Otherwise the versions must be
    equal, or, with `max_staleness > 0` and integer versions (the RL trainer's sync counter), `got` may be
    at most that many versions behind (the async-RL bound); never ahead.
    """
    if not expected or got == expected:
        return True
    if max_staleness > 0:
        try:
            lag = int(expected) - int(got)
        except ValueError:
            return False
        return 0 <= lag <= max_staleness
    return False


@dataclasses.dataclass
class Worker:
    """One SGLang server of the fleet, as this client sees it."""

    url: str
    router_id: str | None = None  # the router's id for it (sglang-router 0.3: a UUID), when behind a router
    live: bool = True  # in rotation
    reason: str = ""  # why it was taken out of rotation
    in_flight: int = 0
    requests: int = 0  # generate requests this client sent it directly (worker-list mode)


class _VersionMismatch(EngineError):
    """A result sampled with other weights than the engine's (a worker missed a sync)."""


def _error_text(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data.get("detail", data)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(data)[:300]


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


def _path(url: str) -> str:
    return urlsplit(url).path or "/"


class Fleet:
    """Worker rotation and weight sync of `SGLangEngine` (mixed in; see the module docstring)."""

    def _pick(self) -> Worker | None:
        """The live worker with the fewest requests in flight (round robin among equals), reserved."""
        with self._lock:
            live = [w for w in self._workers.values() if w.live]
            if not live:
                return None
            low = min(w.in_flight for w in live)
            ties = [w for w in live if w.in_flight == low]
            w = ties[self._rr % len(ties)]
            self._rr += 1
            w.in_flight += 1
            w.requests += 1
            return w

    def _why_none(self) -> str:
        with self._lock:
            return "; ".join(f"{w.url}: {w.reason}" for w in self._workers.values()) or "no workers known"

    # ---- health and info -----------------------------------------------------------------------

    async def _router_workers(self, client: httpx.AsyncClient) -> dict[str, str]:
        """url -> router id of the workers sglang-router lists (`GET /workers`)."""
        resp = await self._request(client, "GET", self.base_url + "/workers")
        data = _json(resp)
        listed = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            raise EngineError(f"router {self.base_url}: GET /workers answered {str(data)[:200]!r}, not a worker list")
        return {str(w["url"]).rstrip("/"): str(w.get("id") or w["url"]) for w in listed if isinstance(w, dict) and w.get("url")}

    async def _sync_targets(self, client: httpx.AsyncClient) -> list[str]:
        """Every worker that must load new weights: the router's, the configured ones, and the ones taken
        out earlier (each sync gives them another chance)."""
        mode = await self._resolve(client)
        if mode == "single":
            return [self.base_url]
        if mode == "router":
            listed = await self._router_workers(client)
            deadline = time.monotonic() + self.discover_timeout_s
            while not listed and not self._workers and time.monotonic() < deadline:
                await asyncio.sleep(0.25)  # a router registers its --worker-urls in the background at start
                listed = await self._router_workers(client)
            with self._lock:
                for url, rid in listed.items():
                    w = self._workers.setdefault(url, Worker(url))
                    w.router_id, w.live, w.reason = rid, True, ""
                for w in self._workers.values():
                    if w.url not in listed:
                        w.router_id = None
                        w.live = False
                        w.reason = w.reason or "not listed by the router"
        with self._lock:
            targets = list(self._workers)
        if not targets:
            raise EngineError(f"router {self.base_url} lists no workers after {self.discover_timeout_s:.0f}s, and none are configured")
        return targets

    def _take_out_local(self, url: str, reason: str) -> None:
        with self._lock:
            w = self._workers.get(url)
            if w is None or not w.live:
                return
            w.live, w.reason = False, reason
            left = sum(1 for x in self._workers.values() if x.live)
            total = len(self._workers)
        msg = f"SGLang worker {url} taken out of rotation: {reason} ({left} of {total} workers left)"
        self.events.append(msg)
        _log.warning(msg)

    async def _take_out(self, client: httpx.AsyncClient, url: str, reason: str) -> None:
        """Out of rotation: this client's list, and the router's (`DELETE /workers/{id}`, awaited)."""
        with self._lock:
            w = self._workers.get(url)
            rid = w.router_id if w is not None else None
        self._take_out_local(url, reason)
        if self._mode != "router" or rid is None:
            return
        try:
            resp = await client.delete(f"{self.base_url}/workers/{rid}")
            if resp.status_code in (404, 405):  # routers before the /workers API
                resp = await client.post(f"{self.base_url}/remove_worker", params={"url": url})
            if resp.status_code >= 400:
                raise EngineError(f"HTTP {resp.status_code}: {_error_text(resp)}")
            # The router queues the removal: wait until it no longer lists the worker, so that no request
            # of the next step can still reach it.
            deadline = time.monotonic() + self.discover_timeout_s
            while url in await self._router_workers(client):
                if time.monotonic() > deadline:
                    raise EngineError(f"still listed after {self.discover_timeout_s:.0f}s")
                await asyncio.sleep(0.1)
        except (EngineError, httpx.TransportError, httpx.TimeoutException) as e:
            # Not fatal: every result's weight version is still checked, so a worker the router keeps
            # sending requests to cannot mix versions into a step; its rows come back as aborts.
            msg = f"router {self.base_url} did not remove worker {url} ({reason}): {e}"
            self.events.append(msg)
            _log.warning(msg)
            return
        with self._lock:
            if w is not None:
                w.router_id = None

    async def _bring_in(self, client: httpx.AsyncClient, url: str) -> None:
        """Back in rotation after it loaded the current weights (re-registered with the router if needed)."""
        with self._lock:
            w = self._workers[url]
            was_out = not w.live
            missing = self._mode == "router" and w.router_id is None
        if missing:
            resp = await client.post(f"{self.base_url}/workers", json={"url": url})
            if resp.status_code >= 400:
                raise EngineError(f"router {self.base_url} refused to add worker {url}: HTTP {resp.status_code}: {_error_text(resp)}")
            deadline = time.monotonic() + self.discover_timeout_s
            while True:
                listed = await self._router_workers(client)
                if url in listed:
                    break
                if time.monotonic() > deadline:
                    raise EngineError(f"router {self.base_url} did not list worker {url} {self.discover_timeout_s:.0f}s after adding it")
                await asyncio.sleep(0.1)
            with self._lock:
                w.router_id = listed[url]
        with self._lock:
            w.live, w.reason = True, ""
        if was_out:
            msg = f"SGLang worker {url} back in rotation"
            self.events.append(msg)
            _log.warning(msg)

    async def _audit_versions(self, client: httpx.AsyncClient, expected: str) -> None:
        """Take out every worker whose `/model_info` reports weights other than `expected`."""
        try:
            targets = [self.base_url] if self._mode == "single" else await self._sync_targets(client)
        except EngineError:
            return
        for url in targets:
            with self._lock:
                live = url in self._workers and self._workers[url].live
            if not live:
                continue
            try:
                got = (await self._model_info(client, url, retries=0)).get("weight_version")
            except EngineError:
                continue
            if got is not None and not version_accepted(str(got), expected, self.max_staleness):
                await self._take_out(client, url, f"serves weights {got!r}, the engine's are {expected!r}")

    # ---- weight sync ---------------------------------------------------------------------------

    def update_weights(self, source: Any, version: str, flush_timeout_s: float = 120.0) -> None:
        """Load new weights on every worker: `source` is an HF checkpoint dir, or a params pytree to export."""
        if isinstance(source, (str, os.PathLike)):
            model_path = os.fspath(source)
        else:
            if self.exporter is None or self.export_root is None:
                raise EngineError("SGLangEngine.update_weights from params needs exporter= and export_root=")
            model_path = os.path.join(self.export_root, f"weights-{version}")
            self.exporter(source, model_path)
        self._run(self._aupdate(model_path, str(version), flush_timeout_s))
        self._weight_version = str(version)

    async def _aupdate(self, model_path: str, version: str, flush_timeout_s: float) -> None:
        async with self._client() as client:
            targets = await self._sync_targets(client)
            outcome = await asyncio.gather(*(self._load_one(client, u, model_path, version, flush_timeout_s) for u in targets))
            failed = {u: why for u, why in zip(targets, outcome) if why}
            if self._mode == "single":  # nothing to rotate: the one server loaded, or the sync failed
                if failed:
                    raise EngineError(failed[targets[0]])
                return
            if len(failed) == len(targets):
                if len(targets) == 1:
                    raise EngineError(next(iter(failed.values())))
                raise EngineError(f"no SGLang worker loaded {model_path} as {version}: "
                                  + "; ".join(f"{u}: {why}" for u, why in failed.items()))
            for url, why in failed.items():
                await self._take_out(client, url, f"failed to load weights {version} ({why})")
            for url in targets:
                if url not in failed:
                    await self._bring_in(client, url)

    async def _load_one(self, client: httpx.AsyncClient, url: str, model_path: str, version: str,
                        flush_timeout_s: float) -> str:
        """Load and flush on one worker; "" on success, else why not."""
        try:
            resp = await self._request(client, "POST", url + "/update_weights_from_disk",
                                       {"model_path": model_path, "weight_version": version})
            data = _json(resp)
            if not isinstance(data, dict) or not data.get("success", False):
                msg = data.get("message", data) if isinstance(data, dict) else data
                return f"SGLang rejected weights {model_path}: {msg}"
            # The KV/radix cache holds activations of the old weights: flush once requests have drained.
            deadline = time.monotonic() + flush_timeout_s
            delay = self.backoff_s
            while True:
                try:
                    r = await client.post(url + "/flush_cache")
                    if r.status_code == 200:
                        break
                    why = f"HTTP {r.status_code}: {_error_text(r)}"
                except (httpx.TransportError, httpx.TimeoutException) as e:
                    why = f"{type(e).__name__}: {e}"
                if time.monotonic() > deadline:
                    return f"SGLang /flush_cache did not succeed within {flush_timeout_s:.0f}s: {why}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            # Servers that report their weight version (SGLang 0.5.x, mpa serve) must report the new one.
            try:
                got = (await self._model_info(client, url, retries=1)).get("weight_version")
            except EngineError:
                got = None
            if got is not None and str(got) != version:
                return f"reports weight version {got!r} after loading {version!r}"
            return ""
        except EngineError as e:
            return str(e)
