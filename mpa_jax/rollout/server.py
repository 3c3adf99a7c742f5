"""`mpa serve`: any `RolloutEngine` behind HTTP (FastAPI + uvicorn), on 127.0.0.1 by default.

Endpoints (the SGLang 0.5.x native subset documented in `mpa_jax.rollout.sglang`, plus OpenAI chat):

    POST /generate                  input_ids (list or list of lists) or text; sampling_params (object or
                                    one per prompt); return_logprob. One object per prompt (a list for a
                                    batch), with output_ids, text and meta_info as SGLang returns them.
    POST /update_weights_from_disk  {"model_path": dir, "weight_version": v} -> {"success", "message"}
    POST|GET /flush_cache           200 when idle, 400 while requests are running (as SGLang)
    GET  /health                    200 when the process is up
    GET  /health_generate           200 after a one-token generation succeeds, else 503
    GET  /model_info, /get_model_info
    GET  /v1/models
    POST /v1/chat/completions       OpenAI chat with `tools`; tool calls in the model output come back
                                    parsed as `message.tool_calls` (arguments as a JSON string)

Concurrent requests are batched: a single worker drains the queue, merging requests with the same
sampling settings (seeds stay per row) into one engine call of up to `max_batch` prompts. The engine
runs in a worker thread so the event loop keeps serving; weight updates take the same lock, so a
generate never sees half-swapped weights.

Bad requests get HTTP 400 with `{"error": {"message": ..., "field": ...}}` naming the field.
"""

import asyncio
import contextlib
import json
import os
import secrets
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from mpa_jax.rollout.types import EngineError, GenerateResult, RolloutEngine, SamplingParams

DEFAULT_MAX_NEW_TOKENS = 128


class RequestError(ValueError):
    """A bad request: `field` names the offending JSON field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# ---- request parsing (plain functions, unit-testable without HTTP) ----------------------------------


def _int(value: Any, field: str, lo: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(field, f"expected an integer, got {json.dumps(value)[:40]}")
    if lo is not None and value < lo:
        raise RequestError(field, f"must be >= {lo}, got {value}")
    return value


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(field, f"expected a number, got {json.dumps(value)[:40]}")
    return float(value)


_SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "sampling_seed", "seed",
    "skip_special_tokens", "no_stop_trim", "ignore_eos", "min_new_tokens", "stop", "n",
    "spaces_between_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p",
}
_NEUTRAL = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0, "min_new_tokens": 0, "n": 1}


def parse_sampling(obj: Any, field: str, default_stop: Sequence[int]) -> tuple[SamplingParams, int | None]:
    """SGLang `sampling_params` object -> (SamplingParams, seed or None); unsupported knobs are rejected."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise RequestError(field, "expected an object")
    for key in obj:
        if key not in _SAMPLING_KEYS:
            raise RequestError(f"{field}.{key}", "unknown sampling parameter")
    for key, neutral in _NEUTRAL.items():
        if key in obj and obj[key] != neutral:
            raise RequestError(f"{field}.{key}", f"not supported by this server (only {neutral})")
    if obj.get("stop"):
        raise RequestError(f"{field}.stop", "stop strings are not supported; use stop_token_ids")
    if obj.get("ignore_eos"):
        raise RequestError(f"{field}.ignore_eos", "not supported; pass stop_token_ids explicitly")
    kw: dict[str, Any] = {}
    kw["max_new_tokens"] = _int(obj.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), f"{field}.max_new_tokens", 1)
    if "temperature" in obj:
        kw["temperature"] = _float(obj["temperature"], f"{field}.temperature")
        if kw["temperature"] < 0:
            raise RequestError(f"{field}.temperature", "must be >= 0")
    if "top_p" in obj:
        kw["top_p"] = _float(obj["top_p"], f"{field}.top_p")
        if not 0.0 < kw["top_p"] <= 1.0:
            raise RequestError(f"{field}.top_p", "must be in (0, 1]")
    if "top_k" in obj:
        kw["top_k"] = _int(obj["top_k"], f"{field}.top_k")
    stops = obj.get("stop_token_ids", list(default_stop))
    if not isinstance(stops, list):
        raise RequestError(f"{field}.stop_token_ids", "expected a list of token ids")
    kw["stop_token_ids"] = tuple(_int(t, f"{field}.stop_token_ids", 0) for t in stops)
    seed = obj.get("sampling_seed", obj.get("seed"))
    if seed is not None:
        seed = _int(seed, f"{field}.sampling_seed")
    return SamplingParams(**kw), seed


def _prompt_list(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], bool]:
    """input_ids / text -> (prompts, was_batch)."""
    if "input_ids" in body and body["input_ids"] is not None:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise RequestError("input_ids", "expected a non-empty list of token ids (or a list of such lists)")
        batch = isinstance(ids[0], list)
        rows = ids if batch else [ids]
        out = []
        for i, row in enumerate(rows):
            where = f"input_ids[{i}]" if batch else "input_ids"
            if not isinstance(row, list) or not row:
                raise RequestError(where, "expected a non-empty list of token ids")
            out.append([_int(t, where, 0) for t in row])
        return out, batch
    if "text" in body and body["text"] is not None:
        if tokenizer is None:
            raise RequestError("text", "this server has no tokenizer; send input_ids")
        text = body["text"]
        batch = isinstance(text, list)
        rows = text if batch else [text]
        if not rows or not all(isinstance(t, str) and t for t in rows):
            raise RequestError("text", "expected a non-empty string or list of strings")
        return [tokenizer.encode(t) for t in rows], batch
    raise RequestError("input_ids", "required (or text)")


def sglang_item(result: GenerateResult, text: str | None, return_logprob: bool, rid: str) -> dict[str, Any]:
    """One SGLang 0.5.x `/generate` response object."""
    if result.finish_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": result.matched_stop}
    elif result.finish_reason == "length":
        finish = {"type": "length", "length": len(result.token_ids)}
    else:
        finish = {"type": "abort", "message": result.error}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.token_ids),
        "cached_tokens": 0,
        "weight_version": result.weight_version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(result.logprobs, result.token_ids)]
    return {"text": text if text is not None else "", "output_ids": result.token_ids, "meta_info": meta}


# ---- batching ---------------------------------------------------------------------------------------


class Batcher:
    """Merges concurrent generate requests into engine calls; the engine is used by one thread at a time."""

    def __init__(self, engine: RolloutEngine, max_batch: int, gather_s: float = 0.002) -> None:
        self.engine = engine
        self.max_batch = max(1, int(max_batch))
        self.gather_s = gather_s
        self.lock = asyncio.Lock()  # held during every engine call and weight update
        self._pending: list[tuple[list[list[int]], SamplingParams, list[int], asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self.in_flight = 0

    @property
    def busy(self) -> bool:
        return bool(self._pending) or self.in_flight > 0

    async def wait_idle(self) -> None:
        """Wait until queued and running engine calls are done (their clients may have gone)."""
        if self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})

    async def submit(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int]) -> list[GenerateResult]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompts, params, seeds, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(self.gather_s)  # let requests that arrive together be merged
        while self._pending:
            first = self._pending.pop(0)
            group = [first]
            n = len(first[0])
            rest = []
            for item in self._pending:
                if item[1] == first[1] and n + len(item[0]) <= self.max_batch:
                    group.append(item)
                    n += len(item[0])
                else:
                    rest.append(item)
            self._pending = rest
            prompts = [p for g in group for p in g[0]]
            seeds = [s for g in group for s in g[2]]
            self.in_flight += 1
            try:
                async with self.lock:
                    results = await asyncio.to_thread(self.engine.generate, prompts, first[1], seeds)
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request
                for g in group:
                    if not g[3].done():
                        g[3].set_exception(e)
                continue
            finally:
                self.in_flight -= 1
            pos = 0
            for g in group:
                k = len(g[0])
                if not g[3].done():
                    g[3].set_result(results[pos : pos + k])
                pos += k


# ---- the app ----------------------------------------------------------------------------------------


def create_app(
    engine: RolloutEngine,
    tokenizer: Any = None,
    *,
    model_path: str = "",
    served_model_name: str = "mpa",
    max_batch: int = 8,
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_wait_s: float = 0.002,
) -> Any:
    """The FastAPI app serving `engine` (and `tokenizer` for text and chat endpoints).

    `batch_wait_s`: how long the batcher waits after a request arrives for others to merge with it.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    batcher: Batcher | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any):
        yield
        # On shutdown, let a running engine call finish first: its worker thread hands the result to
        # this event loop, which must still be open then.
        if batcher is not None:
            await batcher.wait_idle()

    app = FastAPI(title="mpa serve", version="0.1.0", lifespan=lifespan)
    state = {"model_path": model_path}
    default_stop = list(getattr(tokenizer, "eos_token_ids", []) or [])

    def get_batcher() -> Batcher:
        nonlocal batcher
        if batcher is None:  # created inside the running loop (asyncio primitives bind to it)
            batcher = Batcher(engine, max_batch, batch_wait_s)
        return batcher

    def error(status: int, message: str, field: str | None = None) -> JSONResponse:
        err: dict[str, Any] = {"message": message, "code": status}
        if field is not None:
            err["field"] = field
        return JSONResponse({"error": err}, status_code=status)

    async def json_body(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise RequestError("body", "not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("body", "expected a JSON object")
        return body

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return error(400, f"{exc.field}: {exc.message}", exc.field)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error(500, str(exc))

    def fresh_seed() -> int:
        return secrets.randbits(31)

    def decode(ids: list[int]) -> str | None:
        return tokenizer.decode(ids) if tokenizer is not None else None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        try:
            await get_batcher().submit([[0]], SamplingParams(max_new_tokens=1, temperature=0.0), [0])
        except Exception as e:  # noqa: BLE001 - any failure means unhealthy
            return error(503, f"generation failed: {e}")
        return JSONResponse({"status": "ok"})

    def info() -> dict[str, Any]:
        return {
            "model_path": state["model_path"],
            "tokenizer_path": state["model_path"] if tokenizer is not None else None,
            "is_generation": True,
            "served_model_name": served_model_name,
            "weight_version": engine.weight_version,
            "max_batch": max_batch,
            "engine": type(engine).__name__,
        }

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return info()

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return info()

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "owned_by": "mpa"}]}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> JSONResponse:
        if get_batcher().busy:
            return error(400, "Cache not flushed: requests are still running; retry when they finish.")
        return JSONResponse({"success": True, "message": "Cache flushed."})

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> JSONResponse:
        body = await json_body(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise RequestError("model_path", "required: an exported HF checkpoint directory")
        if not os.path.isdir(path):
            raise RequestError("model_path", f"not a directory: {path}")
        version = body.get("weight_version")
        version = str(version) if version is not None else os.path.basename(os.path.normpath(path))
        try:
            async with get_batcher().lock:
                await asyncio.to_thread(engine.update_weights, path, version)
        except Exception as e:  # noqa: BLE001 - report as SGLang does
            return JSONResponse({"success": False, "message": f"{type(e).__name__}: {e}", "num_paused_requests": 0}, status_code=400)
        state["model_path"] = path
        return JSONResponse({"success": True, "message": f"loaded {path} as weight version {version}", "num_paused_requests": 0})

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        body = await json_body(request)
        if body.get("stream"):
            raise RequestError("stream", "streaming is not supported")
        prompts, batch = _prompt_list(body, tokenizer)
        sp = body.get("sampling_params")
        if isinstance(sp, list):
            if len(sp) != len(prompts):
                raise RequestError("sampling_params", f"{len(sp)} entries for {len(prompts)} prompts")
            parsed = [parse_sampling(s, f"sampling_params[{i}]", default_stop) for i, s in enumerate(sp)]
        else:
            parsed = [parse_sampling(sp, "sampling_params", default_stop)] * len(prompts)
        return_logprob = body.get("return_logprob", False)
        if not isinstance(return_logprob, bool):
            raise RequestError("return_logprob", "expected true or false")
        vocab, max_pos = _vocab_size(engine), _max_positions(engine)
        for i, (p, (sp_i, _)) in enumerate(zip(prompts, parsed)):
            where = f"input_ids[{i}]" if batch else "input_ids"
            bad = next((t for t in p if t >= vocab), None)
            if bad is not None:
                raise RequestError(where, f"token id {bad} outside the vocabulary (size {vocab})")
            if len(p) + sp_i.max_new_tokens > max_pos:
                raise RequestError(where, f"{len(p)} prompt tokens + max_new_tokens {sp_i.max_new_tokens} exceed the context ({max_pos})")
            if any(t >= vocab for t in sp_i.stop_token_ids):
                raise RequestError("sampling_params.stop_token_ids", f"a stop token id is outside the vocabulary (size {vocab})")
        # Rows with equal sampling settings share one engine call; seeds stay per row.
        seeds = [s if s is not None else fresh_seed() for _, s in parsed]
        groups: dict[SamplingParams, list[int]] = {}
        for i, (p, _) in enumerate(parsed):
            groups.setdefault(p, []).append(i)
        b = get_batcher()
        results: list[GenerateResult | None] = [None] * len(prompts)
        outs = await asyncio.gather(
            *(b.submit([prompts[i] for i in idx], params, [seeds[i] for i in idx]) for params, idx in groups.items())
        )
        for idx, out in zip(groups.values(), outs):
            for i, r in zip(idx, out):
                results[i] = r
        rid = body.get("rid") or uuid.uuid4().hex
        items = [
            sglang_item(r, decode(r.token_ids), return_logprob, f"{rid}-{i}" if batch else str(rid))
            for i, r in enumerate(results)
            if r is not None
        ]
        return JSONResponse(items if batch else items[0])

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        if tokenizer is None:
            return error(400, "this server has no tokenizer; chat completions need one", "model")
        from mpa_jax import tokenizer as tk

        body = await json_body(request)
        messages = _chat_messages(body.get("messages"))
        tools = _chat_tools(body.get("tools"))
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none", None):
            raise RequestError("tool_choice", "only 'auto' and 'none' are supported")
        if choice == "none":
            tools = None
        if body.get("stream"):
            raise RequestError("stream", "streaming is not supported")
        if body.get("n", 1) != 1:
            raise RequestError("n", "only n=1 is supported")
        if body.get("stop"):
            raise RequestError("stop", "stop strings are not supported")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max_new_tokens))
        kw: dict[str, Any] = {"max_new_tokens": _int(max_tokens, "max_tokens", 1), "stop_token_ids": tuple(default_stop)}
        if body.get("temperature") is not None:
            kw["temperature"] = _float(body["temperature"], "temperature")
            if kw["temperature"] < 0:
                raise RequestError("temperature", "must be >= 0")
        if body.get("top_p") is not None:
            kw["top_p"] = _float(body["top_p"], "top_p")
            if not 0.0 < kw["top_p"] <= 1.0:
                raise RequestError("top_p", "must be in (0, 1]")
        seed = _int(body["seed"], "seed") if body.get("seed") is not None else fresh_seed()
        try:
            prompt = tk.generation_prompt_ids(tokenizer, messages, tools)
        except Exception as e:  # noqa: BLE001 - template errors name the message at fault
            raise RequestError("messages", f"cannot render the chat: {e}") from None
        if len(prompt) + kw["max_new_tokens"] > _max_positions(engine):
            raise RequestError("max_tokens", f"{len(prompt)} prompt tokens + max_tokens {kw['max_new_tokens']} exceed the context ({_max_positions(engine)})")
        (result,) = await get_batcher().submit([prompt], SamplingParams(**kw), [seed])
        text = tokenizer.decode(result.token_ids)
        parsed = tk.parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        finish = "length" if result.finish_reason == "length" else "stop"
        if parsed.calls and tools:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for c in parsed.calls
            ]
            finish = "tool_calls"
        elif parsed.errors:
            message["content"] = _strip_end(text)  # unparsed output comes back verbatim, as SGLang does
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or served_model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(result.token_ids),
                    "total_tokens": len(prompt) + len(result.token_ids),
                },
                "weight_version": result.weight_version,
            }
        )

    return app


def _strip_end(text: str) -> str:
    for end in ("<|im_end|>", "<|endoftext|>"):
        if text.endswith(end):
            return text[: -len(end)]
    return text


def _vocab_size(engine: Any) -> int:
    cfg = getattr(engine, "cfg", None)
    return int(getattr(cfg, "vocab_size", 1 << 62))


def _max_positions(engine: Any) -> int:
    cfg = getattr(engine, "cfg", None)
    return int(getattr(cfg, "max_position_embeddings", 1 << 62))


def _chat_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the template's form (tool-call arguments decoded from JSON strings)."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages", "required: a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(where, "expected an object")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role", f"must be system, user, assistant or tool, got {role!r}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"{where}.content[{j}]", "only text content parts are supported")
                parts.append(part["text"])
            content = "".join(parts)
        if content is not None and not isinstance(content, str):
            raise RequestError(f"{where}.content", "expected a string")
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        if isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(f"{where}.tool_calls[{j}].function.name", "required")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise RequestError(f"{where}.tool_calls[{j}].function.arguments", "not valid JSON") from None
                if not isinstance(args, dict):
                    raise RequestError(f"{where}.tool_calls[{j}].function.arguments", "must be a JSON object")
                calls.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _chat_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools", "expected a list of function tools")
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(f"tools[{i}]", "expected {\"type\": \"function\", \"function\": {...}}")
        if not isinstance(t["function"].get("name"), str):
            raise RequestError(f"tools[{i}].function.name", "required")
    return raw or None


# ---- running the server -----------------------------------------------------------------------------


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
    """Run uvicorn in the foreground until interrupted."""
    import uvicorn

    if on_start is not None:
        on_start(f"http://{host}:{port}")
    uvicorn.run(app, host=host, port=port, log_level="info")
