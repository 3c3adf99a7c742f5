"""Tokenizer and chat format: HF tokenizer directories, the project's BPE, the Qwen3 chat template,
token-in/token-out chat encoding and tool-call parsing. Never imports jax (actor hosts use it)."""
from mpa_jax.tokenizer.build import CONTROL_TOKENS, MARKUP_TOKENS, SPECIAL_TOKENS, build_tokenizer, is_tokenizer_dir
from mpa_jax.tokenizer.chat import (
    ChatSession,
    append_messages,
    assistant_spans,
    encode_chat,
    generation_prompt_ids,
    render_suffix,
)
from mpa_jax.tokenizer.core import Tokenizer, TokenizerError, load_tokenizer
from mpa_jax.tokenizer.corpus import build_project_tokenizer, project_corpus, project_tokenizer, synthetic_corpus
from mpa_jax.tokenizer.select import (
    check_tokenizer_fits,
    model_vocab_size,
    tokenizer_dir_for_config,
    tokenizer_for_config,
)
from mpa_jax.tokenizer.template import QWEN3_CHAT_TEMPLATE, ChatTemplateError, normalize_messages, render_chat
from mpa_jax.tokenizer.toolcall import ParsedOutput, ToolCall, ToolCallError, format_tool_call, parse_tool_calls

__all__ = [
    "CONTROL_TOKENS",
    "MARKUP_TOKENS",
    "SPECIAL_TOKENS",
    "QWEN3_CHAT_TEMPLATE",
    "ChatSession",
    "ChatTemplateError",
    "ParsedOutput",
    "ToolCall",
    "ToolCallError",
    "Tokenizer",
    "TokenizerError",
    "append_messages",
    "assistant_spans",
    "build_project_tokenizer",
    "build_tokenizer",
    "check_tokenizer_fits",
    "encode_chat",
    "format_tool_call",
    "generation_prompt_ids",
    "is_tokenizer_dir",
    "load_tokenizer",
    "model_vocab_size",
    "normalize_messages",
    "parse_tool_calls",
    "project_corpus",
    "project_tokenizer",
    "render_chat",
    "render_suffix",
    "synthetic_corpus",
    "tokenizer_dir_for_config",
    "tokenizer_for_config",
]
