"""`mpa serve`: any `RolloutEngine` behind HTTP (FastAPI + uvicorn), on 127.0.0.1 by default.

Modules, one job each: `protocol` (request validation: JSON -> typed requests or one 400 naming the
field), `slot_batcher` (admission per decode chunk over `rollout.slots`: the default for the embedded
engine), `batcher` (admission of concurrent requests into whole engine calls: other engines),
`streams` (per-row token streams both produce), `openai` (OpenAI response and incremental stream-chunk
shapes: stop strings, log-probs, tool calls, reasoning), `render` (chat prompts in the checkpoint's
context format, forced tool-call openings), `guard` (API key, admission, body size: an ASGI
middleware; `Limits`), `app` (the routes; see its docstring for the endpoints), `runner` (a server on a
thread, or in the foreground on a pre-bound socket).
"""
from __future__ import annotations

from mpa_jax.rollout.server.app import create_app, sglang_item  # noqa: F401
from mpa_jax.rollout.server.batcher import Batcher  # noqa: F401
from mpa_jax.rollout.server.guard import Limits  # noqa: F401
from mpa_jax.rollout.server.slot_batcher import SlotBatcher  # noqa: F401
from mpa_jax.rollout.server.protocol import DEFAULT_MAX_NEW_TOKENS, RequestError, parse_sampling  # noqa: F401
from mpa_jax.rollout.server.runner import ServerThread, serve_forever  # noqa: F401

__all__ = ["Batcher", "DEFAULT_MAX_NEW_TOKENS", "Limits", "RequestError", "ServerThread", "SlotBatcher", "create_app", "parse_sampling",
           "serve_forever", "sglang_item"]
