"""Conversations as token ids: loss masks for SFT, and token-in/token-out incremental rendering for rollouts.

Both rely on ChatML structure (every Qwen template): an assistant turn is `<|im_start|>assistant\\n`, the text
the model generates, and `<|im_end|>`; the template then writes a `\\n` that the model never generates.
Text after a special token is tokenised independently of what came before it, so the text the template
renders after an assistant's `<|im_end|>` can be tokenised on its own and appended to sampled ids.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from mpa_jax.tokenizer.core import IM_END, IM_START, Tokenizer
from mpa_jax.tokenizer.template import ChatTemplateError, render_chat
from mpa_jax.tokenizer.toolcall import ParsedOutput, parse_tool_calls

ASSISTANT_HEADER = IM_START + "assistant\n"

Messages = Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]] | None


def assistant_spans(text: str, expected: int | None = None) -> list[tuple[int, int]]:
    """Character spans [start, end) of assistant-generated text in a rendered ChatML conversation: from
    after `<|im_start|>assistant\\n` up to and including `<|im_end|>` (an unclosed last turn runs to the end)."""
    spans = []
    pos = 0
    while True:
        head = text.find(ASSISTANT_HEADER, pos)
        if head == -1:
            break
        start = head + len(ASSISTANT_HEADER)
        end = text.find(IM_END, start)
        end = len(text) if end == -1 else end + len(IM_END)
        spans.append((start, end))
        pos = end
    if expected is not None and len(spans) != expected:
        raise ChatTemplateError(
            f"rendered chat has {len(spans)} assistant turns but the conversation has {expected}; "
            "is the text of some message holding <|im_start|>assistant or <|im_end|>?"
        )
    return spans


def encode_chat(tok: Tokenizer, messages: Messages, tools: Tools = None, **template_kwargs: Any) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a loss mask: 1 on tokens the assistant generates (its
    content, <think> block, <tool_call> blocks and closing <|im_end|>), 0 elsewhere (headers, the newline
    after <|im_end|>, system/user/tool turns)."""
    text = render_chat(tok, messages, tools, add_generation_prompt=False, **template_kwargs)
    n_assistant = sum(1 for m in messages if m.get("role") == "assistant")
    spans = assistant_spans(text, expected=n_assistant)
    ids, offsets = tok.encode_with_offsets(text)
    mask = [0] * len(ids)
    k = 0
    for t, (start, _end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        # A token belongs to the turn when it starts inside it (one straddling the header stays 0).
        if start >= spans[k][0]:
            mask[t] = 1
    return ids, mask


def generation_prompt_ids(tok: Tokenizer, messages: Messages, tools: Tools = None, **template_kwargs: Any) -> list[int]:
    """Ids of the first prompt: the conversation rendered with the assistant generation header."""
    return tok.encode(render_chat(tok, messages, tools, add_generation_prompt=True, **template_kwargs))


def render_suffix(
    tok: Tokenizer,
    messages_so_far: Messages,
    new_messages: Messages,
    tools: Tools = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """The text the template renders after the last assistant turn of `messages_so_far` (after its
    `<|im_end|>`) when `new_messages` follow: e.g. `\\n<|im_start|>user\\n<tool_response>...`."""
    if not messages_so_far or messages_so_far[-1].get("role") != "assistant":
        raise ChatTemplateError("messages_so_far must end with the assistant turn the ids end with")
    if not new_messages:
        raise ChatTemplateError("new_messages is empty")
    for i, m in enumerate(new_messages):
        if m.get("role") == "assistant":
            raise ChatTemplateError(f"new_messages[{i}] is an assistant turn; append sampled ids for those instead")
    full = list(messages_so_far) + list(new_messages)
    text = render_chat(tok, full, tools, add_generation_prompt=add_generation_prompt, **template_kwargs)
    n_before = sum(1 for m in messages_so_far if m.get("role") == "assistant")
    spans = assistant_spans(text)
    if len(spans) < n_before:
        raise ChatTemplateError("the chat template did not render every assistant turn")
    end = spans[n_before - 1][1]
    if not text[:end].endswith(IM_END):
        raise ChatTemplateError("the last assistant turn is not closed by <|im_end|> in the rendered chat")
    return text[end:]


def append_messages(
    tok: Tokenizer,
    ids: Sequence[int],
    messages_so_far: Messages,
    new_messages: Messages,
    tools: Tools = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Token-in/token-out: `ids` (ending with the sampled assistant turn's <|im_end|>) plus the tokens of
    `new_messages` (tool results, user turns) and the next generation prompt; earlier ids are kept as they are.

    Equals `encode(render_chat(messages_so_far + new_messages, add_generation_prompt=True))` whenever `ids`
    equal the tokens of that rendering up to the last assistant turn.
    """
    im_end = tok.token_id(IM_END)
    if not ids or int(ids[-1]) != im_end:
        raise ChatTemplateError("ids must end with <|im_end|> (the end of the sampled assistant turn)")
    suffix = render_suffix(tok, messages_so_far, new_messages, tools, add_generation_prompt, **template_kwargs)
    return list(ids) + tok.encode(suffix)


def render_copy(messages: Messages) -> list[dict[str, Any]]:
    """Messages for the template with ChatML control strings removed from assistant text.

    Token-in/token-out renders only what follows the last assistant turn, which does not depend on
    assistant text; but an assistant turn whose sampled text spells `<|im_start|>`/`<|im_end|>` would
    confuse the template's turn boundaries, so the copy used for rendering drops those strings.
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant":
            for key in ("content", "reasoning_content"):
                if isinstance(m.get(key), str):
                    m[key] = m[key].replace(IM_START, "").replace(IM_END, "")
        out.append(m)
    return out


class ChatSession:
    """One episode's token stream, built incrementally: prompt, sampled turns, tool/user turns.

    The one token bookkeeping of a rollout (the agent loop keeps its episodes in ChatSessions): `ids`,
    `loss_mask` (1 on sampled tokens), `logprobs` (behaviour log-probs of sampled tokens, 0 elsewhere)
    and `messages` (the parsed chat) stay in step. Every assistant turn ends with `<|im_end|>`, as
    the template renders it: `close_turn` appends an unsampled one (mask 0) when generation stopped
    without it.
    """

    def __init__(self, tok: Tokenizer, messages: Messages, tools: Tools = None, **template_kwargs: Any):
        self.tok = tok
        self.tools = list(tools) if tools is not None else None
        self.template_kwargs = template_kwargs
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.ids: list[int] = generation_prompt_ids(tok, self.messages, self.tools, **template_kwargs)
        self.loss_mask: list[int] = [0] * len(self.ids)
        self.logprobs: list[float] = [0.0] * len(self.ids)
        self.prompt_len = len(self.ids)
        self.im_end = tok.token_id(IM_END)

    def add_sampled(self, sampled_ids: Sequence[int], logprobs: Sequence[float] | None = None) -> ParsedOutput:
        """Append the ids the model sampled for one assistant turn (mask 1, their log-probs) and record
        the parsed message (replace `messages[-1]` to record another). The ids must be decodable."""
        sampled = [int(i) for i in sampled_ids]
        if not sampled:
            raise ChatTemplateError("sampled_ids is empty")
        lps = [0.0] * len(sampled) if logprobs is None else [float(x) for x in logprobs]
        if len(lps) != len(sampled):
            raise ChatTemplateError(f"{len(sampled)} sampled ids but {len(lps)} log-probs")
        parsed = parse_tool_calls(self.tok.decode(sampled))
        self.ids += sampled
        self.loss_mask += [1] * len(sampled)
        self.logprobs += lps
        self.messages.append(parsed.to_message())
        return parsed

    @property
    def turn_closed(self) -> bool:
        """True when the last sampled turn ended with <|im_end|> (so new turns can follow)."""
        return bool(self.ids) and self.ids[-1] == self.im_end

    def close_turn(self) -> bool:
        """End the last turn with an unsampled `<|im_end|>` (mask 0, log-prob 0) unless it has one;
        True when one was appended."""
        if self.turn_closed:
            return False
        self.ids.append(self.im_end)
        self.loss_mask.append(0)
        self.logprobs.append(0.0)
        return True

    def render_messages(self, new_messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        """The ids `add_messages(new_messages)` would append; nothing changes."""
        if not self.turn_closed:
            raise ChatTemplateError("the last assistant turn is not closed by <|im_end|> (call close_turn)")
        suffix = render_suffix(self.tok, render_copy(self.messages), new_messages, self.tools, add_generation_prompt,
                               **self.template_kwargs)
        return self.tok.encode(suffix)

    def add_messages(self, new_messages: Messages, add_generation_prompt: bool = True,
                     ids: Sequence[int] | None = None) -> list[int]:
        """Append tool/user turns (and the next generation prompt) with mask 0; returns the new ids
        (`ids`: what `render_messages` returned for the same messages, to avoid rendering twice)."""
        new = list(ids) if ids is not None else self.render_messages(new_messages, add_generation_prompt)
        self.ids += new
        self.loss_mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        self.messages += [dict(m) for m in new_messages]
        return new
