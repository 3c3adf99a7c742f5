"""The engine protocol every sampler backend implements, its sampling parameters and result type.

No jax here: the agent loop, the SGLang client and the HTTP server are written against these types
only, so they run on hosts that never load an accelerator runtime.

Conventions (shared by the embedded JAX engine, the SGLang client and `mpa serve`):

- A prompt is a list of token ids; a result carries the sampled ids *exactly as sampled*, including
  the stop token that ended generation (SGLang 0.5.x puts the matched stop id in `output_ids` too).
- `logprobs[i]` is the behaviour log-prob of `token_ids[i]`: the full-vocabulary log-softmax of
  `logits / temperature` (of the raw logits when temperature is 0, i.e. greedy). top-p / top-k only
  change which token is drawn, never the reported log-prob; when log-probs feed importance ratios use
  `SamplingParams.for_ratios(...)`, which disables both filters so the two agree.
- `finish_reason` is "stop" (a stop token was sampled; `matched_stop` holds it) or "length"
  (`max_new_tokens` reached) or "abort" (the backend gave up; see `error`).
"""
from __future__ import annotations

import dataclasses
import concurrent.futures
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

FINISH_REASONS = ("stop", "length", "abort")


class EngineError(RuntimeError):
    """A backend failed to generate (server down, timeouts after retries, bad response)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation. `temperature == 0` means greedy (argmax).

    `top_k <= 0` and `top_p >= 1` disable the filters. `stop_token_ids` end a sequence when sampled
    (the id is kept in the output). `seed` makes sampling reproducible: row `i` of a batch uses
    `seed + i` unless per-row seeds are passed to `generate`.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if not (self.temperature >= 0.0):
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int):
            raise ValueError(f"SamplingParams.top_k must be an int, got {self.top_k!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """True when top-k or top-p change the sampling distribution."""
        return self.top_k > 0 or self.top_p < 1.0

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_ratios(cls, **kwargs: Any) -> "SamplingParams":
        """Sampling whose log-probs can feed PPO ratios: no top-p/top-k filtering."""
        kwargs.update(top_p=1.0, top_k=-1)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d


@dataclasses.dataclass
class GenerateResult:
    """One continuation: sampled ids, their behaviour log-probs and why generation ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    matched_stop: int | None = None
    prompt_tokens: int = 0
    weight_version: str = ""
    error: str = ""
    # Per sampled token, the most likely (id, log-prob) pairs of the same distribution, when asked for.
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # Every weight version that sampled tokens of this result, in order, when the engine reports them
    # (the embedded engine swaps weights between decode chunks, so a long request may see two);
    # `weight_version` is the first. Empty: `weight_version` alone.
    weight_versions: tuple[str, ...] = ()
    # Prompt tokens whose keys/values came from the engine's prefix cache instead of being computed
    # (SGLang's `meta_info.cached_tokens`; OpenAI's `usage.prompt_tokens_details.cached_tokens`).
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"GenerateResult: {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"GenerateResult: unknown finish_reason {self.finish_reason!r}")
        self.weight_versions = tuple(self.weight_versions)


@dataclasses.dataclass
class Update:
    """What one streamed request got since its last update: new tokens (and their log-probs / top
    log-probs); `result` is set on the last update, `error` when the request failed."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    result: GenerateResult | None = None
    error: BaseException | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampler backend: the embedded JAX engine, an SGLang server, or anything with this shape."""

    @property
    def weight_version(self) -> str:
        """The version label of the weights the next `generate` uses."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerateResult]:
        """Continue every prompt; results come back in prompt order. `seeds` overrides per-row seeds."""
        ...

    def update_weights(self, source: Any, version: str) -> None:
        """Swap in new weights (a params pytree or an exported HF checkpoint directory) labelled `version`."""
        ...


@runtime_checkable
class StreamingEngine(RolloutEngine, Protocol):
    """A RolloutEngine that also takes requests one at a time (the embedded `jax_engine.Engine`): what a
    continuous episode runner (an episode's next turn submitted when its feedback is ready) and
    `mpa serve` need, so that no caller probes an engine's internals."""

    @property
    def vocab_limit(self) -> int:
        """Sampled ids are below this (the tokenizer's size)."""
        ...

    @property
    def max_positions(self) -> int:
        """Longest prompt + new tokens of one request."""
        ...

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        *,
        top_logprobs: int = 0,
        on_update: Callable[[Update], None] | None = None,
        updates: bool = True,
    ) -> "concurrent.futures.Future[GenerateResult]":
        """Queue one request; its future resolves to its result. `on_update` streams its tokens."""
        ...
