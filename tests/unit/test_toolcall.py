"""Tool-call parsing and formatting in both Qwen formats: round trips, malformed output, garbled text."""
import json
import re

from hypothesis import given, settings, strategies as st

from mpa_jax.tokenizer import ToolCall, format_tool_call, parse_tool_calls
from mpa_jax.tokenizer.toolcall import ParsedOutput

KINDS = {
    "unclosed_think", "unclosed_tag", "unmatched_close", "empty_call", "bad_json", "not_an_object", "missing_name",
    "bad_name", "missing_arguments", "arguments_not_object", "bad_xml", "duplicate_parameter",
}
TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
json_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | text
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8)
xml_keys = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="<>\n"), min_size=1, max_size=12).filter(lambda k: k == k.strip())


def _no_tags(value) -> bool:
    return not any(t in json.dumps(value, ensure_ascii=False) for t in TAGS)


@settings(max_examples=150, deadline=None)
@given(name=names, args=st.dictionaries(text, json_values, max_size=4).filter(_no_tags))
def test_json_format_round_trips(name, args):
    out = parse_tool_calls(format_tool_call(name, args, style="json"))
    assert out.errors == [] and out.content == "" and out.reasoning is None
    assert out.calls == [ToolCall(name, args)]


@settings(max_examples=150, deadline=None)
@given(name=names, args=st.dictionaries(xml_keys, json_values, max_size=4))
def test_xml_format_round_trips_any_values(name, args):
    # Strings that look like JSON, hold tags or newlines are written JSON-encoded and still come back as strings.
    out = parse_tool_calls(format_tool_call(name, args, style="xml"))
    assert out.errors == [] and out.content == ""
    assert out.calls == [ToolCall(name, args)]


def test_json_format_is_the_qwen3_template_rendering():
    s = format_tool_call("convert_units", {"value": 70, "from_unit": "kg", "note": "é"})
    assert s == '<tool_call>\n{"name": "convert_units", "arguments": {"value": 70, "from_unit": "kg", "note": "é"}}\n</tool_call>'


def test_xml_format_layout_and_typed_values():
    s = format_tool_call("set_alarm", {"time": "06:30", "repeat": ["mon"], "n": 2, "code": "7", "zip": "007", "empty": ""}, style="xml")
    assert s.startswith("<tool_call>\n<function=set_alarm>\n<parameter=time>\n06:30\n</parameter>\n")
    assert "<parameter=code>\n\"7\"\n</parameter>" in s and "<parameter=zip>\n007\n" in s  # "7" would read back as 7
    out = parse_tool_calls(s)
    assert out.calls[0].arguments == {"time": "06:30", "repeat": ["mon"], "n": 2, "code": "7", "zip": "007", "empty": ""}


def test_xml_values_json_decoded_when_they_parse():
    raw = "<tool_call>\n<function=f>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\nhello world\n</parameter>\n" \
          "<parameter=c>\n{\"k\": [1, true]}\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_calls(raw).calls == [ToolCall("f", {"a": 12, "b": "hello world", "c": {"k": [1, True]}})]


@settings(max_examples=100, deadline=None)
@given(
    reasoning=st.none() | text.map(lambda s: s.strip("\n")),
    content=text.map(str.strip),
    calls=st.lists(st.tuples(names, st.dictionaries(xml_keys, json_values, max_size=3), st.sampled_from(["json", "xml"])), max_size=3),
    lone_close=st.booleans(),
)
def test_reasoning_content_and_several_calls(reasoning, content, calls, lone_close):
    pieces = [json.dumps(x) for x in (reasoning, content)]
    if any(t in p for p in pieces for t in TAGS) or any(not _no_tags(a) for _, a, _ in calls):
        return
    head = ""
    if reasoning is not None:
        # Qwen3 puts <think> in the generation prompt only sometimes; a lone </think> also closes reasoning.
        head = ("" if lone_close else "<think>\n") + reasoning + "\n</think>\n\n"
    body = "\n".join([content] + [format_tool_call(n, a, style=s) for n, a, s in calls])
    out = parse_tool_calls(head + body + "<|im_end|>")
    assert out.errors == []
    assert out.reasoning == reasoning
    assert out.content == content
    assert out.calls == [ToolCall(n, a) for n, a, _ in calls]


MALFORMED = [
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>", "bad_json"),
    ("<tool_call>\n[1, 2]\n</tool_call>", "not_an_object"),
    ("<tool_call>\n{\"arguments\": {}}\n</tool_call>", "missing_name"),
    ("<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>", "bad_name"),
    ("<tool_call>\n{\"name\": \"a b\", \"arguments\": {}}\n</tool_call>", "bad_name"),
    ("<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "missing_arguments"),
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>", "arguments_not_object"),
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>", "arguments_not_object"),
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", "unclosed_tag"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "unclosed_tag"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", "unclosed_tag"),
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", "missing_name"),
    ("<tool_call>\n<function=f>\njunk\n</function>\n</tool_call>", "bad_xml"),
    ("<tool_call>\n<function=f>\n</function>\ntrailing\n</tool_call>", "bad_xml"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>", "duplicate_parameter"),
    ("<tool_call>\n  \n</tool_call>", "empty_call"),
    ("done</tool_call>", "unmatched_close"),
    ("<think>\nstill thinking when the budget ran out", "unclosed_think"),
]


def test_malformed_output_gives_the_named_error():
    for raw, kind in MALFORMED:
        out = parse_tool_calls(raw)
        assert [e.kind for e in out.errors] == [kind], (raw, out.errors)
        assert out.calls == []
        assert out.errors[0].message and out.errors[0].raw


def test_good_call_after_a_bad_one_is_kept():
    good = format_tool_call("f", {"x": 1})
    out = parse_tool_calls("<tool_call>\n{oops\n</tool_call>\n" + good + "\n<tool_call>{\"name\": \"g\"")
    assert out.calls == [ToolCall("f", {"x": 1})]
    assert [e.kind for e in out.errors] == ["bad_json", "unclosed_tag"]
    # An unclosed call followed by a new one: the first is reported, the second parsed.
    out = parse_tool_calls("<tool_call>\n{\"name\": \"f\"\n" + good)
    assert [e.kind for e in out.errors] == ["unclosed_tag"] and out.calls == [ToolCall("f", {"x": 1})]


def test_to_message_is_an_openai_assistant_message():
    out = parse_tool_calls("<think>\nplan\n</think>\n\nOK\n" + format_tool_call("f", {"a": [1]}))
    assert out.to_message() == {
        "role": "assistant", "content": "OK", "reasoning_content": "plan",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1]}}}],
    }


def test_format_rejects_bad_input():
    for bad in ("", "a b", 'x"y', None):
        try:
            format_tool_call(bad, {})
        except ValueError as e:
            assert "tool name" in str(e)
        else:
            raise AssertionError(f"accepted name {bad!r}")
    for call in (lambda: format_tool_call("f", [1]), lambda: format_tool_call("f", {"a<b": 1}, style="xml"),
                 lambda: format_tool_call("f", {}, style="yaml")):
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("accepted bad input")


FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<function=", "<function=f>", "</function>", "<parameter=",
    "<parameter=a>", "</parameter>", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"f"', "\n", " ", "null",
    "1", '"', "\\", "<|im_end|>", "é", "日本",
])
garbled = st.lists(FRAGMENTS | text, max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(garbled)
def test_garbled_text_never_raises_and_every_call_is_accounted_for(s):
    out = parse_tool_calls(s)
    assert isinstance(out, ParsedOutput)
    assert all(e.kind in KINDS for e in out.errors)
    for call in out.calls:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", call.name) and isinstance(call.arguments, dict)
    if "<think>" not in s and "</think>" not in s:
        # Each <tool_call> opener becomes exactly one call or one error.
        body = s[: -len("<|im_end|>")] if s.endswith("<|im_end|>") else s
        call_errors = [e for e in out.errors if e.kind != "unmatched_close"]
        assert len(out.calls) + len(call_errors) == body.count("<tool_call>")


def test_non_text_input_is_an_error_not_an_exception():
    out = parse_tool_calls(None)  # type: ignore[arg-type]
    assert out.calls == [] and out.errors[0].kind == "bad_input"


@settings(max_examples=100, deadline=None)
@given(
    reasoning=text.map(lambda s: s.strip("\n")),
    content=text.map(str.strip),
    calls=st.lists(st.tuples(names, st.dictionaries(text, json_values, max_size=3)), max_size=3),
)
def test_parsing_the_rendered_assistant_turn_gives_the_message_back(reasoning, content, calls):
    from mpa_jax.tokenizer import QWEN3_CHAT_TEMPLATE, assistant_spans, render_chat

    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning,
           "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
    if not calls:
        del msg["tool_calls"]
    if not _no_tags([reasoning, content, calls]) or "<|im_" in json.dumps([reasoning, content, calls]):
        return
    rendered = render_chat(None, [{"role": "user", "content": "q"}, msg], chat_template=QWEN3_CHAT_TEMPLATE)
    (start, end), = assistant_spans(rendered)
    assert parse_tool_calls(rendered[start:end]).to_message() == msg
