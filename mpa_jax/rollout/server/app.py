"""The `mpa serve` FastAPI app: routes over a `RolloutEngine`, its tokenizer and the batcher.

Endpoints (the SGLang 0.5.x native subset documented in `mpa_jax.rollout.sglang`, plus OpenAI):

    POST /generate                  input_ids (list or list of lists) or text; sampling_params (object or
                                    one per prompt); return_logprob. One object per prompt (a list for a
                                    batch), with output_ids, text and meta_info as SGLang returns them.
    POST /update_weights_from_disk  {"model_path": dir, "weight_version": v} -> {"success", "message"}
    POST|GET /flush_cache           200 when idle, 400 while requests are running (as SGLang)
    GET  /health                    200 when the process is up
    GET  /health_generate           200 after a one-token generation succeeds, else 503
    GET  /model_info, /get_model_info
    GET  /server_info, /get_server_info  model path, tokenizer path, served model name, weight version,
                                    limits (what sglang-router reads when a worker registers)
    GET  /get_load                  [{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}] as
                                    SGLang 0.5.x answers (sglang-router's load monitor polls it)
    GET  /v1/models, /v1/models/{id}
    POST /v1/chat/completions       OpenAI chat with tools: tool calls come back parsed as
                                    `message.tool_calls`; stream, n, logprobs/top_logprobs, stop, seed, usage
    POST /v1/completions            OpenAI (legacy) completions: prompt as text or token ids; the same options

Batching: with the embedded Engine (qwen3 family, no mesh) the server's rows are the slots of a
decode loop (`server.slot_batcher`, `rollout.slots`): a request joins the running batch at the next
decode chunk and leaves it when done. Other engines (or `batcher="call"`) use `server.batcher`: waiting
requests are admitted into the next whole engine call.

Streaming (`stream: true`) answers with server-sent events in OpenAI's chunk format, ending with
`data: [DONE]`: content deltas as tokens are decoded (with the slot loop; the call batcher delivers a
choice's tokens when its call returns), then at each choice's end its reasoning, tool-call deltas and
finish reason, then usage when `stream_options.include_usage` is set. A stop string ends a choice
early (streamed or not); a client that disconnects frees its rows.

Chat rendering (`server.render`): client tools in the checkpoint's context format (compact signatures in
the system message, or the template's JSON schemas), `tool_choice` required / named by a forced call
opening; answers (`server.openai`): reasoning in `reasoning_content`, only calls to offered tools as
`tool_calls`. The model id is `served_model_name`; a request naming another model is a 404.

Errors: one JSON line `{"error": {"message", "type", "code", "param"}}` (`field` too for 400s): a bad
request is 400 naming the field (non-finite or out-of-range numbers, options this server does not
implement, prompts over `serve.max_prompt_chars` / `max_prompt_tokens`); a missing or wrong API key 401,
a body over `serve.max_body_bytes` 413, a full queue 429 (`server.guard`, before the body is read); an
engine failure is 503; anything else is 500 with the exception's class and message, never a traceback.
"""
# No `from __future__ import annotations`: FastAPI reads the route signatures' annotations at runtime
# (`Request` is imported inside create_app).
import asyncio
import contextlib
import logging
import os
import secrets
import time
import uuid
from typing import Any

from mpa_jax.envs.context import ContextFormat
from mpa_jax.rollout.server import openai as oa
from mpa_jax.rollout.server import render
from mpa_jax.rollout.server.batcher import Batcher
from mpa_jax.rollout.server.guard import Admission, Guard, Limits
from mpa_jax.rollout.server.slot_batcher import SlotBatcher
from mpa_jax.rollout.slots import slot_support
from mpa_jax.rollout.server.protocol import (
    DEFAULT_MAX_NEW_TOKENS,
    OpenAIRequest,
    RequestError,
    parse_chat_request,
    parse_completion_request,
    parse_sampling,
    prompt_list,
)
from mpa_jax.rollout.types import EngineError, GenerateResult, RolloutEngine, SamplingParams


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
        "cached_tokens": result.cached_tokens,  # prompt tokens reused from the engine's prefix cache
        "weight_version": result.weight_version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(result.logprobs, result.token_ids)]
    return {"text": text if text is not None else "", "output_ids": result.token_ids, "meta_info": meta}


def create_app(
    engine: RolloutEngine,
    tokenizer: Any = None,
    *,
    model_path: str = "",
    served_model_name: str = "mpa",
    max_batch: int = 8,
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_wait_s: float = 0.002,
    batcher: str = "auto",
    slot_len: int = 1024,
    slot_chunk: int = 8,
    tokenizer_path: str | None = None,
    context: ContextFormat | None = None,
    api_key: str = "",
    limits: Limits | None = None,
) -> Any:
    """The FastAPI app serving `engine` (and `tokenizer` for text, chat and completion endpoints).

    `max_batch`: rows per engine call (requests waiting are admitted up to it); `batch_wait_s`: how
    long an idle server waits after a request arrives for others to merge with it (call batcher).
    `batcher`: "auto" (the slot loop when the engine supports it, else per-call batching, with the
    reason logged), "slots" (the same, but the fallback is logged as a warning) or "call".
    `slot_len`: tokens per slot (prompt bucket + max_tokens; longer requests run as whole engine calls
    between chunks); `slot_chunk`: decode steps per chunk (admission and streaming granularity).
    `tokenizer_path`: where the tokenizer was loaded from (reported by `/server_info`); default: the
    model path when a tokenizer is given. `context`: the checkpoint's context format (how client tools
    are rendered, `server.render`; default json with reasoning). `api_key` (non-empty: required as
    `Authorization: Bearer` on every route but /health) and `limits` (body, prompt, admission; None: no
    limits) are enforced by `server.guard`.
    """
    fmt = context or ContextFormat()
    if batcher not in ("auto", "slots", "call"):
        raise ValueError(f"create_app: batcher must be auto, slots or call, got {batcher!r}")
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    from mpa_jax.rollout.server.guard import error_body

    current: Any = None  # the Batcher or SlotBatcher, created on first use

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any):
        yield
        # On shutdown, let a running engine call finish first: its worker thread hands the result to
        # this event loop, which must still be open then.
        if current is not None:
            await current.wait_idle()
            current.close()

    app = FastAPI(title="mpa serve", version="0.2.0", lifespan=lifespan)
    unbounded = 1 << 62
    limits = limits or Limits(unbounded, unbounded, unbounded, unbounded, unbounded)
    app.state.admission = Admission(limits.max_concurrent_requests, limits.max_queued_requests)
    app.add_middleware(Guard, api_key=api_key, limits=limits, admission=app.state.admission)
    state = {"model_path": model_path}
    load = _Load()  # rows and tokens of the requests being answered (`/get_load`)
    default_stop = list(getattr(tokenizer, "eos_token_ids", []) or [])
    chat_stop = [tokenizer.token_id("<|im_end|>")] if tokenizer is not None and tokenizer.has_token("<|im_end|>") else default_stop

    def get_batcher() -> Any:
        nonlocal current
        if current is None:  # created inside the running loop (asyncio primitives bind to it)
            reason = "batcher='call' was asked for" if batcher == "call" else slot_support(engine)
            if reason is None:
                current = SlotBatcher(engine, max_batch, max_len=slot_len, chunk=slot_chunk)
            else:
                level = logging.WARNING if batcher == "slots" else logging.INFO
                logging.getLogger(__name__).log(level, "mpa serve: per-call batching (%s)", reason)
                current = Batcher(engine, max_batch, batch_wait_s)
        return current

    app.state.get_batcher = get_batcher

    def error(status: int, message: str, field: str | None = None) -> JSONResponse:
        return Response(error_body(status, message, field), status_code=status, media_type="application/json")

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
        return error(exc.status, f"{exc.field}: {exc.message}", exc.field)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()[:1]}", "body")

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error(503, f"engine error: {exc}")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    def fresh_seed() -> int:
        return secrets.randbits(31)

    def decode(ids: list[int]) -> str | None:
        return tokenizer.decode(ids) if tokenizer is not None else None

    def check_chars(n: int, where: str) -> None:
        if n > limits.max_prompt_chars:
            raise RequestError(where, f"the prompt is {n} characters, more than serve.max_prompt_chars ({limits.max_prompt_chars})")

    def check_prompt(p: list[int], max_new: int, where: str, max_field: str) -> None:
        vocab, max_pos = _vocab_limit(engine, tokenizer), _max_positions(engine)
        if len(p) > limits.max_prompt_tokens:
            raise RequestError(where, f"the prompt is {len(p)} tokens, more than serve.max_prompt_tokens ({limits.max_prompt_tokens})")
        bad = next((t for t in p if t >= vocab), None)
        if bad is not None:
            raise RequestError(where, f"token id {bad} outside the vocabulary (size {vocab})")
        if len(p) + max_new > max_pos:
            raise RequestError(max_field, f"{len(p)} prompt tokens + {max_new} new tokens exceed the context ({max_pos})")

    async def start(prompts: list[list[int]], params: SamplingParams, n: int, seed: int | None, top: int,
                    updates: bool = True) -> Any:
        """A RowStream of n choices per prompt (choice j of prompt i at row i*n + j); seeds seed+k when given.
        `updates`: tokens as they are decoded (streams, stop strings to watch), else each row's result alone."""
        if top and not get_batcher().supports_top_logprobs:
            raise RequestError("top_logprobs", f"not supported by this engine ({type(engine).__name__})")
        rows = [p for p in prompts for _ in range(n)]
        seeds = [seed + k if seed is not None else fresh_seed() for k in range(len(rows))]
        return get_batcher().stream_rows(rows, params, seeds, top, updates=updates)

    async def results_of(stream: Any, stops: list[str]) -> list[GenerateResult]:
        try:
            return await oa.collect(tokenizer, stream, stops)
        except ValueError as e:  # the engine's own checks (shapes, limits) name the input
            raise RequestError("prompt", str(e)) from None

    # ---- health and info ---------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        try:
            await get_batcher().submit([[0]], SamplingParams(max_new_tokens=1, temperature=0.0), [0])
        except Exception as e:  # noqa: BLE001 - any failure means unhealthy
            return error(503, f"generation failed: {type(e).__name__}: {e}")
        return JSONResponse({"status": "ok"})

    def info() -> dict[str, Any]:
        return {
            "model_path": state["model_path"],
            "tokenizer_path": tokenizer_path if tokenizer_path is not None else (state["model_path"] if tokenizer is not None else None),
            "is_generation": True,
            "served_model_name": served_model_name,
            "weight_version": engine.weight_version,
            "max_batch": max_batch,
            "engine": type(engine).__name__,
            "batcher": get_batcher().kind,
        }

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return info()

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return info()

    def server_info() -> dict[str, Any]:
        # SGLang 0.5.x answers its server arguments plus run-time state; sglang-router reads model_path,
        # served_model_name (its model id) and the limits. Only what this server really has is reported.
        from mpa_jax import __version__

        return {
            **info(),
            "version": f"mpa-{__version__}",
            "dp_size": 1,
            "tp_size": 1,
            "max_running_requests": max_batch,
            "max_batch_size": max_batch,
            "context_length": _max_positions(engine),
            "internal_states": [{"weight_version": engine.weight_version, "num_reqs": load.rows, **engine_counts()}],
        }

    def engine_counts() -> dict[str, int]:
        # The embedded engine's running totals (prefix cache, compiled programs); other engines have none.
        stats = engine.stats() if callable(getattr(type(engine), "stats", None)) else {}
        keys = ("prompt_tokens", "cached_tokens", "prefill_tokens", "programs", "compiles")
        return {k: int(stats[k]) for k in keys if k in stats}

    @app.get("/server_info")
    async def get_server_info_new() -> dict[str, Any]:
        return server_info()

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        return server_info()

    @app.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        # Rows past max_batch wait for a free row of the batcher; num_tokens counts prompt + budget.
        return [{"dp_rank": 0, "num_reqs": load.rows, "num_waiting_reqs": max(0, load.rows - max_batch),
                 "num_tokens": load.tokens}]

    def model_card() -> dict[str, Any]:
        return {"id": served_model_name, "object": "model", "created": 0, "owned_by": "mpa",
                "max_model_len": _max_positions(engine), "weight_version": engine.weight_version}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str) -> JSONResponse:
        if model_id != served_model_name:
            return error(404, f"model {model_id!r} not found; this server serves {served_model_name!r}", "model")
        return JSONResponse(model_card())

    # ---- weights -----------------------------------------------------------------------------------

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

    # ---- SGLang-native generate --------------------------------------------------------------------

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        body = await json_body(request)
        if body.get("stream"):
            raise RequestError("stream", "streaming is not supported on /generate; use the OpenAI endpoints")
        check_chars(_chars(body.get("text")), "text")
        prompts, batch = await asyncio.to_thread(prompt_list, body, tokenizer)
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
        vocab = _vocab_limit(engine, tokenizer)
        for i, (p, (sp_i, _)) in enumerate(zip(prompts, parsed)):
            where = f"input_ids[{i}]" if batch else "input_ids"
            check_prompt(p, sp_i.max_new_tokens, where, where)
            if any(t >= vocab for t in sp_i.stop_token_ids):
                raise RequestError("sampling_params.stop_token_ids", f"a stop token id is outside the vocabulary (size {vocab})")
        seeds = [s if s is not None else fresh_seed() for _, s in parsed]
        try:
            with load.track(len(prompts), sum(len(p) + sp_i.max_new_tokens for p, (sp_i, _) in zip(prompts, parsed))):
                results = await get_batcher().submit(prompts, [p for p, _ in parsed], seeds)
        except ValueError as e:
            raise RequestError("input_ids", str(e)) from None
        rid = body.get("rid") or uuid.uuid4().hex
        items = [sglang_item(r, decode(r.token_ids), return_logprob, f"{rid}-{i}" if batch else str(rid))
                 for i, r in enumerate(results)]
        return JSONResponse(items if batch else items[0])

    # ---- OpenAI ------------------------------------------------------------------------------------

    def need_tokenizer(what: str) -> None:
        if tokenizer is None:
            raise RequestError("model", f"this server has no tokenizer; {what} need one")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        need_tokenizer("chat completions")
        from mpa_jax import tokenizer as tk

        body = await json_body(request)
        req, messages = parse_chat_request(body, tokenizer, default_max_new_tokens, chat_stop, served_model_name)
        check_chars(_chars(messages) + _chars(req.tools), "messages")
        forced, prefix = render.forced_opening(tokenizer, req.tool_choice, fmt, req.tools)
        try:  # off the event loop: a long prompt does not hold up the other requests
            prompt = await asyncio.to_thread(render.chat_prompt, tokenizer, messages, req.tools, fmt, forced, req.template_kwargs)
        except Exception as e:  # noqa: BLE001 - template errors name the message at fault
            raise RequestError("messages", f"cannot render the chat: {e}") from None
        max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        check_prompt(prompt, req.params.max_new_tokens, "messages", max_field)
        rows, tokens = req.n, req.n * (len(prompt) + req.params.max_new_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        fingerprint = f"mpa-{engine.weight_version}"
        if req.stream:
            stream = await start([prompt], req.params, req.n, req.seed, req.logprobs or 0, updates=True)
            events = oa.chat_events(tokenizer, stream, req.stop, req.tools, rid=rid, model=req.model,
                                    fingerprint=fingerprint, top_n=req.logprobs, prompt_tokens=len(prompt),
                                    include_usage=req.include_usage, prefix=prefix, parallel=req.parallel_tool_calls)
            return StreamingResponse(load.tracked(events, rows, tokens), media_type="text/event-stream")
        with load.track(rows, tokens):
            stream = await start([prompt], req.params, req.n, req.seed, req.logprobs or 0, updates=bool(req.stop))
            results = await results_of(stream, req.stop)
        outs = [oa.shape_output(tokenizer, r, req.stop) for r in results]
        shaped = [oa.chat_message(tokenizer, o, req.tools, prefix, req.parallel_tool_calls) for o in outs]
        use = oa.usage(len(prompt), sum(o.completion_tokens for o in outs), max(r.cached_tokens for r in results))
        choices = [
            {"index": i, "message": msg, "finish_reason": finish,
             "logprobs": oa.chat_logprobs(tokenizer, o, req.logprobs) if req.logprobs is not None else None}
            for i, (o, (msg, finish)) in enumerate(zip(outs, shaped))
        ]
        return JSONResponse({"id": rid, "object": "chat.completion", "created": int(time.time()), "model": req.model,
                             "system_fingerprint": fingerprint, "choices": choices, "usage": use,
                             "weight_version": engine.weight_version})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        need_tokenizer("completions")
        body = await json_body(request)
        check_chars(_chars(body.get("prompt")), "prompt")
        req: OpenAIRequest = await asyncio.to_thread(parse_completion_request, body, tokenizer, default_stop, served_model_name)
        max_field = "max_tokens"
        for i, p in enumerate(req.prompts):
            check_prompt(p, req.params.max_new_tokens, f"prompt[{i}]" if len(req.prompts) > 1 else "prompt", max_field)
        rid = f"cmpl-{uuid.uuid4().hex}"
        fingerprint = f"mpa-{engine.weight_version}"
        n_prompt = sum(len(p) for p in req.prompts)
        rows, tokens = req.n * len(req.prompts), req.n * (n_prompt + len(req.prompts) * req.params.max_new_tokens)
        if req.stream:
            stream = await start(req.prompts, req.params, req.n, req.seed, req.logprobs or 0, updates=True)
            events = oa.completion_events(tokenizer, stream, req.stop, rid=rid, model=req.model, fingerprint=fingerprint,
                                          top_n=req.logprobs, prompt_tokens=n_prompt, include_usage=req.include_usage)
            return StreamingResponse(load.tracked(events, rows, tokens), media_type="text/event-stream")
        with load.track(rows, tokens):
            stream = await start(req.prompts, req.params, req.n, req.seed, req.logprobs or 0, updates=bool(req.stop))
            results = await results_of(stream, req.stop)
        outs = [oa.shape_output(tokenizer, r, req.stop) for r in results]
        use = oa.usage(n_prompt, sum(o.completion_tokens for o in outs), sum(r.cached_tokens for r in results) // req.n)
        choices = [
            {"index": i, "text": o.text, "finish_reason": o.finish_reason,
             "logprobs": oa.completion_logprobs(tokenizer, o, req.logprobs) if req.logprobs is not None else None}
            for i, o in enumerate(outs)
        ]
        return JSONResponse({"id": rid, "object": "text_completion", "created": int(time.time()), "model": req.model,
                             "system_fingerprint": fingerprint, "choices": choices, "usage": use})

    return app


class _Load:
    """Rows and tokens (prompt + budget) of the generation requests being answered, for `/get_load`.

    Counted here, around the batcher calls, so the figure does not depend on which batcher runs; the
    event loop is single-threaded, so plain integers suffice.
    """

    def __init__(self) -> None:
        self.rows = 0
        self.tokens = 0

    @contextlib.contextmanager
    def track(self, rows: int, tokens: int) -> Any:
        self.rows += rows
        self.tokens += tokens
        try:
            yield
        finally:
            self.rows -= rows
            self.tokens -= tokens

    async def tracked(self, events: Any, rows: int, tokens: int) -> Any:
        """`events` (a streaming body) counted from its first chunk until it ends or the client leaves."""
        with self.track(rows, tokens):
            async for event in events:
                yield event


def _chars(obj: Any) -> int:
    """Characters of the text in a request part (strings in nested lists and dicts; ids count 1 each)."""
    if isinstance(obj, str):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_chars(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_chars(v) if isinstance(v, (str, list, dict)) else 1 for v in obj)
    return 0


def _vocab_limit(engine: Any, tokenizer: Any) -> int:
    """Ids a prompt may hold: the engine's vocabulary limit, else the model's vocabulary."""
    limit = getattr(engine, "vocab_limit", None)
    if limit is None:
        limit = getattr(getattr(engine, "cfg", None), "vocab_size", None)
    return int(limit) if limit is not None else 1 << 62


def _max_positions(engine: Any) -> int:
    cfg = getattr(engine, "cfg", None)
    return int(getattr(cfg, "max_position_embeddings", 1 << 62))
