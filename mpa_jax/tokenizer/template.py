"""Chat templates: the project's own Qwen3-format template and an HF-compatible jinja2 renderer.

The renderer matches `transformers`' `apply_chat_template(..., tokenize=False)`: a sandboxed jinja2
environment with `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that keeps
non-ASCII and HTML characters, `raise_exception`, `strftime_now`, and reasoning given as `reasoning`/`thinking`
aliased to `reasoning_content`. It needs jinja2 only (no transformers, no jax).
"""
from __future__ import annotations

import copy
import datetime
import functools
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from mpa_jax.tokenizer.core import Tokenizer

ROLES = ("system", "user", "assistant", "tool")

# The project's chat template, in the Qwen3 format: ChatML turns, tool schemas in the system turn, tool calls
# as JSON in <tool_call>, tool results as <tool_response> blocks grouped into one user turn, and reasoning in
# <think> kept only on the assistant turns after the last real user query (and always on the last turn).
QWEN3_CHAT_TEMPLATE = r"""
{%- macro turn(role, text) -%}
{{- '<|im_start|>' ~ role ~ '\n' ~ text ~ '<|im_end|>\n' -}}
{%- endmacro -%}
{%- set count = messages | length -%}
{%- set first_is_system = count > 0 and messages[0].role == 'system' -%}
{%- set system_text = (messages[0].content if first_is_system and messages[0].content is string else '') -%}
{#- System turn: the caller's system text, then the tool manifest when tools are given. -#}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if first_is_system -%}{{- system_text ~ '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for spec in tools -%}{{- '\n' ~ (spec | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    ~ '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    ~ '\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
{{- turn('system', system_text) -}}
{%- endif -%}
{#- The last real user query (tool results sent as user text do not count). -#}
{%- set state = namespace(query=count - 1, searching=true) -%}
{%- for back in range(count - 1, -1, -1) -%}
{%- set m = messages[back] -%}
{%- if state.searching and m.role == 'user' and m.content is string
      and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
{%- set state.query = back -%}
{%- set state.searching = false -%}
{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- set i = loop.index0 -%}
{%- set text = m.content if m.content is string else '' -%}
{%- if m.role == 'user' or (m.role == 'system' and i > 0) -%}
{{- turn(m.role, text) -}}
{%- elif m.role == 'assistant' -%}
{#- Reasoning comes from reasoning_content, else from a <think> block written into the content. -#}
{%- set thought = '' -%}
{%- if m.reasoning_content is string -%}
{%- set thought = m.reasoning_content -%}
{%- elif '</think>' in text -%}
{%- set thought = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set text = text.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- if i > state.query and (loop.last or thought) -%}
{{- '<|im_start|>assistant\n<think>\n' ~ thought.strip('\n') ~ '\n</think>\n\n' ~ text.lstrip('\n') -}}
{%- else -%}
{{- '<|im_start|>assistant\n' ~ text -}}
{%- endif -%}
{%- for call in (m.tool_calls or []) -%}
{%- if not loop.first or text -%}{{- '\n' -}}{%- endif -%}
{%- set fn = call.function if call.function else call -%}
{%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}
{{- '<tool_call>\n{"name": "' ~ fn.name ~ '", "arguments": ' ~ args ~ '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{#- Consecutive tool results share one user turn. -#}
{%- if i == 0 or messages[i - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' ~ text ~ '\n</tool_response>' -}}
{%- if loop.last or messages[i + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".strip()


class ChatTemplateError(ValueError):
    """A conversation or template could not be rendered; the message names what was wrong."""


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace() that refuses underscore names (no reaching into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for key in attrs:
            _Namespace._check(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, key: str, value: Any) -> None:
        _Namespace._check(key)
        jinja2.utils.Namespace.__setitem__(self, key, value)

    @staticmethod
    def _check(key: Any) -> None:
        if isinstance(key, str) and key.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat template may not set namespace attribute {key!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    # jinja's own tojson HTML-escapes; chat templates expect plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts `{% generation %}...{% endgeneration %}` (HF assistant-mask markers) and renders the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once (cached by its text)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = dict
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from None


def _plain(value: Any, where: str) -> Any:
    """A deep copy made of JSON types only (what the sandbox may see)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict(), where)
    raise ChatTemplateError(f"{where}: value of type {type(value).__name__} is not JSON data")


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate OpenAI-style messages and return plain copies with reasoning aliased to `reasoning_content`."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        m = _plain(m, f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}] has role {role!r}; expected one of {', '.join(ROLES)}")
        if m.get("content") is not None and not isinstance(m["content"], str):
            raise ChatTemplateError(f"messages[{i}] content must be a string, got {type(m['content']).__name__}")
        reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise ChatTemplateError(f"messages[{i}] reasoning_content must be a string")
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        calls = m.get("tool_calls")
        if calls:
            if role != "assistant":
                raise ChatTemplateError(f"messages[{i}] ({role}) has tool_calls; only assistant messages may")
            if not isinstance(calls, list):
                raise ChatTemplateError(f"messages[{i}] tool_calls must be a list")
            for j, call in enumerate(calls):
                fn = call.get("function", call) if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise ChatTemplateError(f"messages[{i}].tool_calls[{j}] needs a function name")
                if not isinstance(fn.get("arguments"), (dict, str)):
                    raise ChatTemplateError(f"messages[{i}].tool_calls[{j}] arguments must be a dict or a JSON string")
        out.append(m)
    return out


def render_chat(
    tok: "Tokenizer | None",
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    chat_template: str | None = None,
    **template_kwargs: Any,
) -> str:
    """Render a conversation to text through a chat template (the tokenizer's own unless `chat_template`).

    `tools` are OpenAI function dicts (`ToolSpec.to_openai()`); extra keyword arguments (e.g.
    `enable_thinking=False`) reach the template as variables, as in `transformers`.
    """
    source = chat_template if chat_template is not None else (tok.chat_template if tok is not None else None)
    if not source:
        raise ChatTemplateError("the tokenizer has no chat template and none was given")
    msgs = normalize_messages(messages)
    if not msgs:
        raise ChatTemplateError("messages is empty")
    if tools is not None:
        if isinstance(tools, Mapping) or not isinstance(tools, Sequence):
            raise ChatTemplateError(f"tools must be a list of OpenAI function dicts, got {type(tools).__name__}")
        tools = [_plain(t, f"tools[{k}]") for k, t in enumerate(tools)]
        for k, t in enumerate(tools):
            if not isinstance(t, dict):
                raise ChatTemplateError(f"tools[{k}] must be a dict (OpenAI function form)")
    template = compile_template(source)
    special: dict[str, Any] = {}
    if tok is not None:
        special = tok.special_tokens_map()
    variables = {**special, **copy.deepcopy(template_kwargs)}
    try:
        return template.render(messages=msgs, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
