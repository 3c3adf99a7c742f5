"""HTTP client for SGLang's native API, as a `RolloutEngine`: one server, a list of workers, or sglang-router.

Pinned to the SGLang **0.5.x** native payloads (checked against 0.5.2-0.5.5) and sglang-router 0.3.x;
`mpa serve` implements the same subset, and the tests drive this client against it (and against the
real router) over loopback HTTP.

Where requests go (`engine_from_config` reads `config.rollout.sglang_url` / `sglang_workers`):

- a **router** (`sglang_url` answers `GET /workers` with a worker list, as sglang-router does): every
  request goes to the router, which picks a worker; the client learns the workers from `/workers` for
  weight sync. `sglang_workers`, when also given, are synced too (and re-registered if missing);
- a **worker list** (`sglang_workers`, `sglang_url` empty): the client balances itself, each request to
  the live worker with the fewest requests in flight; a worker that refuses or drops connections is
  taken out of rotation (and tried again at the next weight sync);
- one **server** (`sglang_url` that is not a router): as before.

`POST /generate` request, one per prompt (the shape sglang-router accepts: it rejects a list of
`sampling_params`; one object with batched `input_ids` would pin the whole batch to one worker)::

    {"input_ids": [int, ...],
     "sampling_params": {"max_new_tokens": N, "temperature": T, "top_p": P, "top_k": K,
                         "stop_token_ids": [...], "sampling_seed": S,
                         "skip_special_tokens": false, "no_stop_trim": true},
     "return_logprob": true}

A batch's prompts go out concurrently (at most `max_concurrency` in flight), so the router or this
client spreads them over the workers; results come back in prompt order. `max_new_tokens` and
`stop_token_ids` are always explicit (server defaults differ by version); `top_p=1`, `top_k=-1` whenever
the log-probs feed importance ratios (`SamplingParams.for_ratios`). `sampling_seed` is the per-request
seed of 0.5.x (send_seed=False drops it for older servers); an SGLang server honours it only when
started with `--enable-deterministic-inference` (docs/scaling.md).

Response: one object per prompt::

    {"text": str, "output_ids": [int, ...],
     "meta_info": {"finish_reason": {"type": "stop", "matched": id} | {"type": "length", "length": n}
                                    | {"type": "abort", "message": str},
                   "prompt_tokens": int, "completion_tokens": int,
                   "output_token_logprobs": [[logprob, token_id, text_or_null], ...],
                   "weight_version": str}}

The matched stop id is the last entry of `output_ids` (SGLang trims stop *strings* from text only).

Failures: a prompt whose request fails (after retries: transport errors, timeouts and 5xx answers are
retried with exponential backoff; 4xx answers fail at once with the server's message), whose answer is
malformed, or whose `weight_version` is not the engine's (beyond `max_staleness`) comes back as a
`finish_reason="abort"` result carrying the reason, so only that episode becomes infra; when every
prompt of a call fails, `generate` raises `EngineError`.

Weight sync (`update_weights`): export an HF checkpoint directory once (or take one; every worker must
see the path), then on **every** worker concurrently `POST /update_weights_from_disk`
`{"model_path": dir, "weight_version": v}` -> `{"success": bool, "message": str}` and
`POST /flush_cache` until it answers 200 (400 while requests are still running), then check the
worker's `/model_info` `weight_version` when it reports one. A worker that fails is taken out of
rotation with a warning naming it and the reason (the router's `DELETE /workers/{id}`, or this client's
own list), so no later result mixes weight versions; when no worker loads, `EngineError` and the version
stays. Health: `GET /health_generate` (a one-token generation), `GET /health`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import httpx

from mpa_jax.rollout.sglang_fleet import Fleet, Worker, _VersionMismatch, _attempts, _error_text, _json, _path, version_accepted  # noqa: F401
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams

SGLANG_VERSION = "0.5.x"
SGLANG_ROUTER_VERSION = "0.3.x"

_log = logging.getLogger(__name__)


def sampling_payload(params: SamplingParams, seed: int | None, send_seed: bool = True) -> dict[str, Any]:
    """The SGLang 0.5.x `sampling_params` object for one prompt."""
    payload: dict[str, Any] = {
        "max_new_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k > 0 else -1,
        "stop_token_ids": [int(t) for t in params.stop_token_ids],
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if send_seed and seed is not None:
        payload["sampling_seed"] = int(seed)
    return payload


def _entry(e: Any, i: int) -> tuple[float, int]:
    """(logprob, token id) of one `output_token_logprobs` entry; malformed -> EngineError."""
    if not isinstance(e, (list, tuple)) or len(e) < 2 or isinstance(e[1], bool) or not isinstance(e[1], int):
        raise EngineError(f"SGLang /generate: output_token_logprobs[{i}] is not [logprob, token_id, ...]: {e!r}")
    try:
        lp = float(e[0])
    except (TypeError, ValueError):
        raise EngineError(f"SGLang /generate: output_token_logprobs[{i}] has a non-numeric logprob {e[0]!r}") from None
    return lp, int(e[1])


def parse_generate_item(item: Any, weight_version: str = "", vocab_limit: int | None = None) -> GenerateResult:
    """Turn one `/generate` response object into a GenerateResult; malformed -> EngineError naming the field.

    With `vocab_limit` (the tokenizer's size), a token id outside [0, vocab_limit) is an EngineError:
    the server sampled an id the tokenizer cannot decode (a padded embedding row).
    """
    if not isinstance(item, dict):
        raise EngineError(f"SGLang /generate: expected an object per prompt, got {type(item).__name__}")
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise EngineError("SGLang /generate: response lacks meta_info")
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        raise EngineError("SGLang /generate: meta_info.output_token_logprobs missing (was return_logprob sent?)")
    pairs = [_entry(e, i) for i, e in enumerate(entries)]
    lp_ids = [t for _, t in pairs]
    ids = item.get("output_ids")
    if ids is None:
        ids = lp_ids
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise EngineError("SGLang /generate: output_ids is not a list of integers")
    if ids != lp_ids:
        raise EngineError(
            f"SGLang /generate: output_ids ({len(ids)}) and output_token_logprobs ({len(lp_ids)}) disagree"
        )
    bad = next((t for t in ids if t < 0 or (vocab_limit is not None and t >= vocab_limit)), None)
    if bad is not None:
        raise EngineError(
            f"SGLang /generate: the server returned token id {bad}, outside the tokenizer's vocabulary"
            f" [0, {vocab_limit if vocab_limit is not None else '...'}); the server's model and the tokenizer disagree"
            " (a padded embedding row was sampled, or the wrong model is served)"
        )
    logprobs = [lp for lp, _ in pairs]
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        kind = str(fr.get("type", ""))
        matched = fr.get("matched")
    elif isinstance(fr, str):
        kind, matched = fr, None
    else:
        raise EngineError(f"SGLang /generate: unreadable meta_info.finish_reason {fr!r}")
    if kind not in ("stop", "length", "abort"):
        raise EngineError(f"SGLang /generate: unknown finish_reason type {kind!r}")
    return GenerateResult(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=kind,
        matched_stop=int(matched) if isinstance(matched, int) else None,
        prompt_tokens=int(meta.get("prompt_tokens", 0) or 0),
        weight_version=str(meta.get("weight_version", weight_version) or weight_version),
        error=str(fr.get("message", "")) if isinstance(fr, dict) and kind == "abort" else "",
    )


class SGLangEngine(Fleet):
    """`RolloutEngine` over SGLang (or `mpa serve`) servers' native HTTP API: one server, a worker list,
    or sglang-router in front of workers (see the module docstring)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        workers: Sequence[str] = (),
        router: bool | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 32,
        send_seed: bool = True,
        exporter: Callable[[Any, str], None] | None = None,
        export_root: str | None = None,
        weight_version: str = "",
        vocab_limit: int | None = None,
        max_staleness: int = 0,
        discover_timeout_s: float = 60.0,
        api_key: str = "",
    ) -> None:
        """`base_url`: a router or a single server (`router=None` asks the URL whether it is a router);
        `workers`: the worker URLs (synced always; balanced by this client when there is no router).

        `exporter(params, out_dir)` writes an HF checkpoint; needed only to sync a params pytree.
        `vocab_limit` (the tokenizer's size): a response carrying an id at or above it is an error naming
        the id, never a token passed on to decoding. `max_staleness`: how many versions behind the
        engine's a result may be (0: exactly the engine's version). `discover_timeout_s`: how long to
        wait for a freshly started router to list its workers. `api_key`: sent as `Authorization: Bearer`
        on every request (servers started with `--api-key`: SGLang, `mpa serve`).
        """
        base = (base_url or "").strip()
        urls = [str(u).strip().rstrip("/") for u in workers if str(u).strip()]
        if not base and not urls:
            raise ValueError("SGLangEngine: give base_url (a server or a router) or workers (a list of worker URLs)")
        for u in ([base] if base else []) + urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"SGLang URL must start with http:// or https://, got {u!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"SGLangEngine: a worker URL is listed twice: {urls}")
        if router and not base:
            raise ValueError("SGLangEngine: router=True needs base_url (the router's URL)")
        if max_concurrency < 1:
            raise ValueError(f"SGLangEngine: max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"SGLangEngine: max_retries must be >= 0, got {max_retries}")
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"SGLangEngine: max_staleness must be an int >= 0, got {max_staleness!r}")
        if vocab_limit is not None and (isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int) or vocab_limit < 1):
            raise ValueError(f"SGLangEngine: vocab_limit must be a positive int (the tokenizer's size), got {vocab_limit!r}")
        self.base_url = base.rstrip("/") if base else (urls[0] if len(urls) == 1 else "")
        self.configured = urls
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.send_seed = send_seed
        self.exporter = exporter
        self.export_root = export_root
        self._weight_version = weight_version
        self.vocab_limit = vocab_limit
        self.max_staleness = max_staleness
        self.discover_timeout_s = discover_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.device_s = 0.0  # wall time spent waiting on the servers, for rollout cost accounting
        self.failed_rows = 0  # prompts that failed (request, answer or weight version): aborts, or a raised call
        self.events: list[str] = []  # fleet changes (workers taken out / brought back), oldest first
        self._lock = threading.Lock()  # fleet state is shared by the RL trainer's rollout and sync threads
        # Mode: "router" (requests to base_url, workers from its /workers), "fleet" (this client balances
        # over `workers`) or "single". Unknown until the first call when base_url has to be asked.
        if base and router is None:
            self._mode: str | None = None
        elif base and router:
            self._mode = "router"
        elif base and not urls:
            self._mode = "single"
        elif base:
            raise ValueError("SGLangEngine: router=False with both base_url and workers; give the workers only")
        else:
            self._mode = "fleet" if len(urls) > 1 else "single"
        self._workers: dict[str, Worker] = {u: Worker(u) for u in urls}
        self._rr = 0  # round-robin cursor for ties between equally loaded workers

    @property
    def weight_version(self) -> str:
        return self._weight_version

    @property
    def mode(self) -> str | None:
        """"router", "fleet" or "single"; None until the base URL has been asked whether it is a router."""
        return self._mode

    def workers(self) -> list[Worker]:
        """The workers this client knows (router-listed ones once a sync has discovered them)."""
        with self._lock:
            return [dataclasses.replace(w) for w in self._workers.values()]

    def live_workers(self) -> list[str]:
        with self._lock:
            return [w.url for w in self._workers.values() if w.live]

    # ---- HTTP plumbing -------------------------------------------------------------------------

    async def _request(self, client: httpx.AsyncClient, method: str, url: str, body: Any = None,
                       retries: int | None = None) -> httpx.Response:
        """One call to `url` with retries on transport errors, timeouts and 5xx; 4xx raise at once."""
        retries = self.max_retries if retries is None else retries
        path = _path(url)
        last = ""
        for attempt in range(retries + 1):
            try:
                resp = await client.request(method, url, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return resp
                if resp.status_code < 500:
                    raise EngineError(f"SGLang {method} {path}: HTTP {resp.status_code}: {_error_text(resp)}")
                last = f"HTTP {resp.status_code}: {_error_text(resp)}"
            if attempt < retries:
                await asyncio.sleep(self.backoff_s * (2**attempt))
        raise EngineError(f"SGLang {method} {path} failed after {_attempts(retries + 1)}: {last}")

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        return httpx.AsyncClient(timeout=self.timeout_s, limits=limits, headers=self._headers)

    @staticmethod
    def _run(coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        coro.close()
        raise RuntimeError("SGLangEngine sync methods cannot run inside an event loop; await the a* methods")

    async def _resolve(self, client: httpx.AsyncClient) -> str:
        """The mode, asking `base_url` once whether it is a router (sglang-router answers `GET /workers`)."""
        if self._mode is not None:
            return self._mode
        try:
            resp = await client.get(self.base_url + "/workers", timeout=min(self.timeout_s, 30.0))
        except (httpx.TransportError, httpx.TimeoutException):
            return "single"  # unreachable: calls fail with their own message; ask again next time
        is_router = resp.status_code == 200 and isinstance(_json(resp), dict) and isinstance(_json(resp).get("workers"), list)
        if not is_router and self.configured:
            raise EngineError(
                f"{self.base_url} is not a router (GET /workers: HTTP {resp.status_code}); with worker URLs given,"
                " the base URL (rollout.sglang_url) must be an sglang-router or empty"
            )
        self._mode = "router" if is_router else "single"
        return self._mode

    # ---- generation ----------------------------------------------------------------------------

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[GenerateResult]:
        """Async `generate`: one request per prompt, at most `max_concurrency` in flight."""
        prompts = [list(map(int, p)) for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"generate: prompt {i} is empty")
        if not prompts:
            return []
        row_seeds = list(seeds) if seeds is not None else [params.seed + i for i in range(len(prompts))]
        expected = self._weight_version
        sem = asyncio.Semaphore(self.max_concurrency)
        t0 = time.perf_counter()

        async def one(client: httpx.AsyncClient, i: int) -> GenerateResult | EngineError:
            body = {"input_ids": prompts[i], "sampling_params": sampling_payload(params, row_seeds[i], self.send_seed),
                    "return_logprob": True}
            try:
                async with sem:
                    resp, where = await self._post_generate(client, body)
                data = _json(resp)
                if isinstance(data, list) and len(data) == 1:
                    data = data[0]
                if not isinstance(data, dict):
                    raise EngineError(f"SGLang /generate: expected one result object, got {str(data)[:100]!r}")
                result = parse_generate_item(data, expected, self.vocab_limit)
                if not version_accepted(result.weight_version, expected, self.max_staleness):
                    raise _VersionMismatch(
                        f"SGLang /generate{where}: sampled with weights {result.weight_version!r}, expected {expected!r}"
                        f"{f' (at most {self.max_staleness} behind)' if self.max_staleness else ''}: a worker missed the weight sync"
                    )
                return result
            except EngineError as e:
                return e

        async with self._client() as client:
            mode = await self._resolve(client)
            if mode == "fleet" and not self.live_workers():
                raise EngineError(f"no SGLang worker in rotation: {self._why_none()}")
            outs = await asyncio.gather(*(one(client, i) for i in range(len(prompts))))
            if any(isinstance(o, _VersionMismatch) for o in outs):
                # Somebody serves old weights: find who and take them out before the next call.
                await self._audit_versions(client, expected)
        self.device_s += time.perf_counter() - t0
        errors = [o for o in outs if isinstance(o, EngineError)]
        self.failed_rows += len(errors)
        if errors and len(errors) == len(outs):
            raise EngineError(str(errors[0]) if len(errors) == 1 else f"all {len(errors)} requests failed; first: {errors[0]}")
        # A failed prompt is an abort result: its episode becomes infra, the batch's others go on.
        return [o if isinstance(o, GenerateResult) else
                GenerateResult([], [], "abort", weight_version=expected, error=str(o), prompt_tokens=len(p))
                for o, p in zip(outs, prompts)]

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[GenerateResult]:
        """Blocking wrapper over `agenerate`."""
        return self._run(self.agenerate(prompts, params, seeds))

    async def _post_generate(self, client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[httpx.Response, str]:
        """POST /generate where the mode sends it; returns the response and " on <worker>" when known."""
        if self._mode != "fleet":
            return await self._request(client, "POST", self.base_url + "/generate", body), ""
        last = ""
        for attempt in range(self.max_retries + 1):
            w = self._pick()
            if w is None:
                raise EngineError(f"SGLang /generate: no worker in rotation ({self._why_none()}); last error: {last}")
            try:
                resp = await client.post(w.url + "/generate", json=body)
            except httpx.TimeoutException as e:  # slow, not gone: retry elsewhere, keep it in rotation
                last = f"{w.url}: {type(e).__name__}: {e}"
            except httpx.TransportError as e:  # refused or dropped: the worker is gone
                last = f"{w.url}: {type(e).__name__}: {e}"
                self._take_out_local(w.url, f"/generate failed: {type(e).__name__}: {e}")
            else:
                if resp.status_code < 400:
                    return resp, f" on {w.url}"
                if resp.status_code < 500:
                    raise EngineError(f"SGLang POST /generate on {w.url}: HTTP {resp.status_code}: {_error_text(resp)}")
                last = f"{w.url}: HTTP {resp.status_code}: {_error_text(resp)}"
            finally:
                with self._lock:
                    w.in_flight -= 1
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * (2**attempt))
        raise EngineError(f"SGLang POST /generate failed after {_attempts(self.max_retries + 1)}: {last}")

    async def ahealth(self) -> bool:
        """True when `/health_generate` answers 200 (the server, the router, or any live worker)."""
        urls = [self.base_url] if self.base_url else self.live_workers()
        async with self._client() as client:
            for url in urls:
                try:
                    resp = await client.get(url + "/health_generate")
                except (httpx.TransportError, httpx.TimeoutException):
                    continue
                if resp.status_code == 200:
                    return True
        return False

    def health(self) -> bool:
        return self._run(self.ahealth())

    def wait_healthy(self, timeout_s: float = 60.0, poll_s: float = 0.5) -> None:
        """Block until the server is healthy; EngineError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.health():
                return
            time.sleep(poll_s)
        raise EngineError(f"SGLang server at {self.base_url or self.configured} not healthy after {timeout_s:.0f}s")

    def model_info(self, url: str | None = None) -> dict[str, Any]:
        """`GET /model_info` (falls back to the older `/get_model_info`, which the router proxies) of
        `url`, else of the base URL (a router answers for one of its workers), else the first live worker."""

        async def go() -> dict[str, Any]:
            target = url or self.base_url or next(iter(self.live_workers()), "")
            if not target:
                raise EngineError(f"no SGLang worker in rotation: {self._why_none()}")
            async with self._client() as client:
                return await self._model_info(client, target)

        return self._run(go())

    async def _model_info(self, client: httpx.AsyncClient, url: str, retries: int | None = None) -> dict[str, Any]:
        try:
            resp = await self._request(client, "GET", url + "/model_info", retries=retries)
        except EngineError:
            resp = await self._request(client, "GET", url + "/get_model_info", retries=retries)
        data = _json(resp)
        if not isinstance(data, dict):
            raise EngineError(f"SGLang GET /model_info on {url}: expected an object, got {str(data)[:100]!r}")
        return data

    # ---- the fleet -----------------------------------------------------------------------------

def engine_from_config(
    config: Any,
    *,
    vocab_limit: int | None = None,
    exporter: Callable[[Any, str], None] | None = None,
    export_root: str | None = None,
    weight_version: str = "",
) -> SGLangEngine:
    """The SGLang client `config.rollout` describes; the one constructor the trainer and `mpa rollout` use.

    Keys (configs/tiny.py): `sglang_url` (a router, or a single server; "" with a worker list),
    `sglang_workers` (worker URLs: a tuple, or one comma-separated string), `batch_size` (requests in
    flight), `sglang_timeout_s`, `sglang_max_retries`, `sglang_max_staleness`. Bad values raise
    ValueError naming the key.
    """
    r = config.rollout
    url = str(r.sglang_url or "").strip()
    raw = r.sglang_workers
    if isinstance(raw, str):
        workers = [u for u in raw.replace(",", " ").split() if u]
    elif isinstance(raw, (list, tuple)):
        workers = [str(u) for u in raw]
    else:
        raise ValueError(f"config.rollout.sglang_workers must be a tuple of URLs or a comma-separated string, got {raw!r}")
    if not url and not workers:
        raise ValueError("config.rollout.sglang_url (a server or router) or config.rollout.sglang_workers must be set")

    def number(key: str, kind: type, lo: float) -> Any:
        value = r[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)) or value < lo:
            raise ValueError(f"config.rollout.{key} must be {'an int' if kind is int else 'a number'} >= {lo:g}, got {value!r}")
        return kind(value)

    try:
        return SGLangEngine(
            url or None,
            workers=workers,
            max_concurrency=number("batch_size", int, 1),
            timeout_s=number("sglang_timeout_s", float, 1e-3),
            max_retries=number("sglang_max_retries", int, 0),
            max_staleness=number("sglang_max_staleness", int, 0),
            exporter=exporter,
            export_root=export_root,
            weight_version=weight_version,
            vocab_limit=vocab_limit,
            # the servers' key (`mpa serve --api-key`'s too): $MPA_API_KEY, else config.serve.api_key
            api_key=os.environ.get("MPA_API_KEY") or (str(config.serve.api_key) if "serve" in config else ""),
        )
    except ValueError as e:
        raise ValueError(f"config.rollout (sglang_url={url!r}, sglang_workers={workers!r}): {e}") from None
