"""Small real parts for tests and demos of the rollout path.

- `ScriptedEngine`: a `RolloutEngine` that replays given texts (tokenised with a real tokenizer) as
  the model's turns, so agent-loop and server logic can be exercised on known outputs. Log-probs
  are deterministic made-up numbers (-0.1 per token): it is a test double of the *model*, not of the
  code under test.
- `tiny_checkpoint(out_dir, vocab_size, seed)`: a random tiny Qwen3 written with `transformers`
  (every parameter randomised with a large enough scale that greedy outputs vary), the parity
  reference for the embedded engine.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from mpa_jax.rollout.types import GenerateResult, SamplingParams


class ScriptedEngine:
    """Replays scripted assistant turns. `script(prompt_ids, call_index) -> text` picks each reply.

    The reply's ids get `<|im_end|>` appended (as a stopped model would sample it) unless the text
    already ends with a stop token or is longer than `max_new_tokens` (then it is cut: "length").
    """

    def __init__(self, tokenizer: Any, script: Callable[[list[int], int], str] | Sequence[str], weight_version: str = "scripted"):
        self.tokenizer = tokenizer
        if callable(script):
            self._script = script
        else:
            texts = list(script)
            self._script = lambda _ids, i: texts[min(i, len(texts) - 1)]
        self._weight_version = weight_version
        self.calls: list[tuple[list[list[int]], SamplingParams, list[int] | None]] = []
        self._n = 0
        self.device_s = 0.0

    @property
    def weight_version(self) -> str:
        return self._weight_version

    def update_weights(self, source: Any, version: str) -> None:
        self._weight_version = str(version)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None) -> list[GenerateResult]:
        self.calls.append(([list(p) for p in prompts], params, list(seeds) if seeds is not None else None))
        out = []
        for p in prompts:
            text = self._script(list(p), self._n)
            self._n += 1
            ids = self.tokenizer.encode(text)
            stops = set(params.stop_token_ids)
            if not ids or ids[-1] not in stops:
                ids.append(self.tokenizer.token_id("<|im_end|>"))
            reason = "stop"
            if len(ids) > params.max_new_tokens:
                ids = ids[: params.max_new_tokens]
                reason = "stop" if ids[-1] in stops else "length"
            out.append(
                GenerateResult(
                    token_ids=ids,
                    logprobs=[-0.1] * len(ids),
                    finish_reason=reason,
                    matched_stop=ids[-1] if reason == "stop" else None,
                    prompt_tokens=len(p),
                    weight_version=self._weight_version,
                )
            )
        return out


def tiny_checkpoint(out_dir: str, vocab_size: int = 512, seed: int = 0, scale: float = 0.5, **overrides: Any) -> str:
    """Write a random tiny Qwen3 HF checkpoint (float32) with `transformers`; returns `out_dir`."""
    import torch
    import transformers

    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    kw.update(overrides)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)  # norms too: every parameter randomised
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
