"""Chat prompts for `mpa serve` in the checkpoint's own context format, and forced tool-call openings.

A checkpoint is trained on one context format (`envs.context.ContextFormat`): "json" checkpoints (real
Qwen ones) read the tools as JSON schemas rendered by the chat template; "compact" ones (the starter)
read one signature line per tool in the system message and were never shown the template's tool block.
The server renders a client's `tools` the way the checkpoint was trained, with the same code the episode
runner uses (`envs.context.compact_tools`), so a client that sends `tools=` gets the behaviour the
checkpoint learned.

`tool_choice` "required" or a named function is honoured by forcing the opening of a call: the tokens
`forced_opening` returns (`<tool_call>\n{"name": "` or up to `"arguments":` for a named one) are appended
to the prompt as the start of the assistant turn, and the server prepends their text to the generated
text before parsing (SGLang and vLLM constrain the whole call with a grammar; here only the opening is
fixed, the rest is the model's, and a call that then names a tool not offered comes back as text).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from mpa_jax.envs import context as ctx
from mpa_jax.envs.contract import ToolSpec
from mpa_jax.tokenizer.toolcall import CALL_OPEN, THINK_CLOSE, THINK_OPEN


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    """A parsed `tool_choice`: mode auto | none | required | function (then `name` is the function)."""

    mode: str = "auto"
    name: str | None = None


def tool_specs(tools: list[dict[str, Any]]) -> list[ToolSpec]:
    """OpenAI function tools -> the envs' ToolSpec (what `envs.context` renders)."""
    specs = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {"type": "object", "properties": {}}
        specs.append(ToolSpec(name=fn["name"], app="client", domain="client", description=str(fn.get("description") or ""),
                              parameters=params))
    return specs


def template_inputs(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    fmt: ctx.ContextFormat) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to hand the chat template for a checkpoint trained on `fmt`.

    compact: the signature block is appended to the system message (a system message holding only it
    is added when the client sent none), exactly as `envs.prompt.observation` builds an episode's
    context, and the template gets no tools. json: unchanged.
    """
    if fmt.format != "compact" or not tools:
        return messages, tools
    block = ctx.compact_tools(tool_specs(tools))
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        system = out[0].get("content") or ""
        out[0]["content"] = f"{system}\n{block}" if system else block
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, None


def forced_prefix(choice: ToolChoice, fmt: ctx.ContextFormat) -> str:
    """The assistant text that opens a tool call for `tool_choice` required / named ("" otherwise).

    A checkpoint trained with reasoning writes `<think>...</think>` before a call: the forced turn skips
    it with an empty block (what Qwen3 writes with thinking disabled); one trained without reasoning
    starts its turn with the call itself.
    """
    if choice.mode not in ("required", "function"):
        return ""
    head = "" if fmt.reasoning == "none" else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
    head += CALL_OPEN + '\n{"name": "'
    if choice.mode == "function":
        head += f'{choice.name}", "arguments": '
    return head


def forced_opening(tokenizer: Any, choice: ToolChoice, fmt: ctx.ContextFormat,
                   tools: list[dict[str, Any]] | None) -> tuple[list[int], str]:
    """(ids, text) that open the forced call: the longest run of the tokens a whole call would have that
    stays within `forced_prefix`, so the prompt ends on a token boundary the model saw in training (a
    prefix encoded alone can split `", "arguments": {` differently and derail a small model)."""
    from mpa_jax.tokenizer.toolcall import format_tool_call

    target = forced_prefix(choice, fmt)
    if not target:
        return [], ""
    name = choice.name or (tools or [{"function": {"name": "f"}}])[0]["function"]["name"]
    head = target[: target.index(CALL_OPEN)]
    ids = tokenizer.encode(head + format_tool_call(name, {"query": "text"}))
    k = len(ids)
    while k and not target.startswith(tokenizer.decode(ids[:k])):
        k -= 1
    return ids[:k], tokenizer.decode(ids[:k])


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                fmt: ctx.ContextFormat, forced: list[int] | None = None,
                template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Prompt ids: the chat rendered for `fmt` with the generation prompt, then the `forced` opening ids."""
    from mpa_jax import tokenizer as tk

    msgs, tmpl_tools = template_inputs(messages, tools, fmt)
    ids = tk.generation_prompt_ids(tokenizer, msgs, tmpl_tools, **(template_kwargs or {}))
    return ids + list(forced or [])
