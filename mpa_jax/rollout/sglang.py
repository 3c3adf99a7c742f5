"""HTTP client for an SGLang server's native API, as a `RolloutEngine`.

Pinned to the SGLang **0.5.x** native payloads (checked against 0.5.2-0.5.5); `mpa serve` implements
the same subset, and the tests drive this client against it over loopback HTTP.

`POST /generate` request (one HTTP request carries a batch of prompts)::

    {"input_ids": [[int, ...], ...],
     "sampling_params": [{"max_new_tokens": N, "temperature": T, "top_p": P, "top_k": K,
                          "stop_token_ids": [...], "sampling_seed": S,
                          "skip_special_tokens": false, "no_stop_trim": true}, ...],   # one per prompt
     "return_logprob": true}

`max_new_tokens` and `stop_token_ids` are always explicit (server defaults differ by version);
`top_p=1`, `top_k=-1` whenever the log-probs feed importance ratios (`SamplingParams.for_ratios`).
`sampling_seed` is the per-request seed of 0.5.x (send_seed=False drops it for older servers).

Response: a list with one object per prompt::

    {"text": str, "output_ids": [int, ...],
     "meta_info": {"finish_reason": {"type": "stop", "matched": id} | {"type": "length", "length": n}
                                    | {"type": "abort", "message": str},
                   "prompt_tokens": int, "completion_tokens": int,
                   "output_token_logprobs": [[logprob, token_id, text_or_null], ...],
                   "weight_version": str}}

The matched stop id is the last entry of `output_ids` (SGLang trims stop *strings* from text only).

Weight sync: export an HF checkpoint directory (or take one), `POST /update_weights_from_disk`
`{"model_path": dir, "weight_version": v}` -> `{"success": bool, "message": str}`, then
`POST /flush_cache` until it answers 200 (it answers 400 while requests are still running).
Health: `GET /health_generate` (runs a one-token generation), `GET /health`.

Batches are split into requests of `request_batch` prompts sent concurrently with at most
`max_concurrency` in flight; transport errors, timeouts and 5xx answers are retried with exponential
backoff; 4xx answers fail at once with the server's message.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable, Sequence

import httpx

from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams

SGLANG_VERSION = "0.5.x"


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


class SGLangEngine:
    """`RolloutEngine` over an SGLang (or `mpa serve`) server's native HTTP API."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 32,
        request_batch: int = 8,
        send_seed: bool = True,
        exporter: Callable[[Any, str], None] | None = None,
        export_root: str | None = None,
        weight_version: str = "",
        vocab_limit: int | None = None,
    ) -> None:
        """`exporter(params, out_dir)` writes an HF checkpoint; needed only to sync a params pytree.

        `vocab_limit` (the tokenizer's size): a response carrying an id at or above it is an
        EngineError naming the id, never a token passed on to decoding.
        """
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"SGLang base_url must start with http:// or https://, got {base_url!r}")
        if max_concurrency < 1 or request_batch < 1:
            raise ValueError("SGLangEngine: max_concurrency and request_batch must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.request_batch = request_batch
        self.send_seed = send_seed
        self.exporter = exporter
        self.export_root = export_root
        self._weight_version = weight_version
        if vocab_limit is not None and (isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int) or vocab_limit < 1):
            raise ValueError(f"SGLangEngine: vocab_limit must be a positive int (the tokenizer's size), got {vocab_limit!r}")
        self.vocab_limit = vocab_limit
        self.device_s = 0.0  # wall time spent waiting on the server, for rollout cost accounting

    @property
    def weight_version(self) -> str:
        return self._weight_version

    # ---- HTTP plumbing -------------------------------------------------------------------------

    async def _request(self, client: httpx.AsyncClient, method: str, path: str, body: Any = None) -> httpx.Response:
        """One call with retries on transport errors, timeouts and 5xx; 4xx raise at once."""
        url = self.base_url + path
        last = ""
        for attempt in range(self.max_retries + 1):
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
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * (2**attempt))
        raise EngineError(f"SGLang {method} {path} failed after {self.max_retries + 1} attempts: {last}")

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        return httpx.AsyncClient(timeout=self.timeout_s, limits=limits)

    @staticmethod
    def _run(coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        raise RuntimeError("SGLangEngine sync methods cannot run inside an event loop; await the a* methods")

    # ---- generation ----------------------------------------------------------------------------

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[GenerateResult]:
        """Async `generate`: requests of `request_batch` prompts, at most `max_concurrency` in flight."""
        prompts = [list(map(int, p)) for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"generate: prompt {i} is empty")
        row_seeds = list(seeds) if seeds is not None else [params.seed + i for i in range(len(prompts))]
        sem = asyncio.Semaphore(self.max_concurrency)
        t0 = time.perf_counter()

        async def one(client: httpx.AsyncClient, lo: int, hi: int) -> list[GenerateResult]:
            body = {
                "input_ids": prompts[lo:hi],
                "sampling_params": [sampling_payload(params, row_seeds[i], self.send_seed) for i in range(lo, hi)],
                "return_logprob": True,
            }
            async with sem:
                resp = await self._request(client, "POST", "/generate", body)
            data = resp.json()
            if isinstance(data, dict):
                data = [data]
            if not isinstance(data, list) or len(data) != hi - lo:
                raise EngineError(f"SGLang /generate: expected {hi - lo} results, got {len(data) if isinstance(data, list) else data!r}")
            return [parse_generate_item(d, self._weight_version, self.vocab_limit) for d in data]

        async with self._client() as client:
            chunks = [(lo, min(lo + self.request_batch, len(prompts))) for lo in range(0, len(prompts), self.request_batch)]
            parts = await asyncio.gather(*(one(client, lo, hi) for lo, hi in chunks))
        self.device_s += time.perf_counter() - t0
        return [r for part in parts for r in part]

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[GenerateResult]:
        """Blocking wrapper over `agenerate`."""
        return self._run(self.agenerate(prompts, params, seeds))

    # ---- health and info -----------------------------------------------------------------------

    async def ahealth(self) -> bool:
        """True when `/health_generate` answers 200 (the server can run a generation)."""
        async with self._client() as client:
            try:
                resp = await client.get(self.base_url + "/health_generate")
            except (httpx.TransportError, httpx.TimeoutException):
                return False
        return resp.status_code == 200

    def health(self) -> bool:
        return self._run(self.ahealth())

    def wait_healthy(self, timeout_s: float = 60.0, poll_s: float = 0.5) -> None:
        """Block until the server is healthy; EngineError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.health():
                return
            time.sleep(poll_s)
        raise EngineError(f"SGLang server at {self.base_url} not healthy after {timeout_s:.0f}s")

    def model_info(self) -> dict[str, Any]:
        """`GET /model_info` (falls back to the older `/get_model_info`)."""

        async def go() -> dict[str, Any]:
            async with self._client() as client:
                try:
                    resp = await self._request(client, "GET", "/model_info")
                except EngineError:
                    resp = await self._request(client, "GET", "/get_model_info")
                return resp.json()

        return self._run(go())

    # ---- weight sync ---------------------------------------------------------------------------

    def update_weights(self, source: Any, version: str, flush_timeout_s: float = 120.0) -> None:
        """Load new weights on the server: `source` is an HF checkpoint dir, or a params pytree to export."""
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
            resp = await self._request(
                client, "POST", "/update_weights_from_disk", {"model_path": model_path, "weight_version": version}
            )
            data = resp.json()
            if not data.get("success", False):
                raise EngineError(f"SGLang rejected weights {model_path}: {data.get('message', data)}")
            # The KV/radix cache holds activations of the old weights: flush once requests have drained.
            deadline = time.monotonic() + flush_timeout_s
            delay = self.backoff_s
            while True:
                try:
                    r = await client.post(self.base_url + "/flush_cache")
                    if r.status_code == 200:
                        return
                    why = f"HTTP {r.status_code}: {_error_text(r)}"
                except (httpx.TransportError, httpx.TimeoutException) as e:
                    why = f"{type(e).__name__}: {e}"
                if time.monotonic() > deadline:
                    raise EngineError(f"SGLang /flush_cache did not succeed within {flush_timeout_s:.0f}s: {why}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def hf_exporter(cfg: Any, tokenizer_dir: str | None = None, dtype: str | None = None) -> Callable[[Any, str], None]:
    """An `exporter` for `SGLangEngine`: writes a params pytree of `cfg` as an HF checkpoint directory
    (with the tokenizer files when `tokenizer_dir` is given) that SGLang can load from disk."""

    def export(params: Any, out_dir: str) -> None:
        from mpa_jax import models

        models.save_pretrained(models.Model(cfg, params), out_dir, tokenizer_dir=tokenizer_dir, dtype=dtype)

    return export


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
