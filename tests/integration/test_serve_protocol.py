"""`mpa serve`'s chat protocol as OpenAI clients call it, over loopback HTTP with the official `openai` client:
tools rendered in the checkpoint's context format, reasoning split into `reasoning_content`, calls to tools
not offered returned as text, `tool_choice` required / named (the forced opening is in the prompt),
`parallel_tool_calls`, the served model name (404 for another), and the harmless fields clients send.

The model is a `ScriptedEngine` (a test double that replays fixed assistant text): what is under test is
the server's rendering and parsing, which must be exact for given model text.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs.context import ContextFormat
from mpa_jax.rollout.server import ServerThread, create_app
from mpa_jax.rollout.testing import ScriptedEngine

TOOLS = [
    {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm.",
                                      "parameters": {"type": "object", "properties": {"time": {"type": "string"},
                                                                                      "label": {"type": "string"}},
                                                     "required": ["time"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
]
USER = [{"role": "user", "content": "wake me at 7"}]
COMPACT = ContextFormat("compact", "none")


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)


def _serve(tok, replies, **kw):
    engine = ScriptedEngine(tok, replies)
    return engine, ServerThread(create_app(engine, tok, served_model_name="starter", **kw))


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _stream(c, **kw):
    """(content, reasoning, tool calls by index, finish) reassembled from a stream as clients do."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for t in d.tool_calls or []:
                e = calls.setdefault(t.index, {"name": "", "arguments": ""})
                e["name"] += (t.function.name or "") if t.function else ""
                e["arguments"] += (t.function.arguments or "") if t.function else ""
            finish = ch.finish_reason or finish
    return content, reasoning, calls, finish


def test_compact_checkpoint_gets_signatures_in_the_system_message(tok):
    engine, srv = _serve(tok, [tk.format_tool_call("set_alarm", {"time": "07:00"})], context=COMPACT)
    with srv as server:
        c = _client(server)
        r = c.chat.completions.create(model="starter", messages=[{"role": "system", "content": "Be brief."}, *USER],
                                      tools=TOOLS, temperature=0)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "set_alarm" and json.loads(call.function.arguments) == {"time": "07:00"}
        # The prompt is what the episode runner renders for a compact context: the client's system text,
        # then one signature line per tool (envs.context), and no JSON schema block from the template.
        expected = [{"role": "system", "content": "Be brief.\nTools:\nset_alarm(time, label?)\nget_weather(city?)"}, *USER]
        assert tok.decode(engine.calls[0][0][0]) == tk.render_chat(tok, expected, None, add_generation_prompt=True)
        # Without a system message, one holding only the signatures is added.
        c.chat.completions.create(model="starter", messages=USER, tools=TOOLS)
        expected = [{"role": "system", "content": "Tools:\nset_alarm(time, label?)\nget_weather(city?)"}, *USER]
        assert tok.decode(engine.calls[1][0][0]) == tk.render_chat(tok, expected, None, add_generation_prompt=True)
    # A json checkpoint (the default) gets the template's schema block.
    engine, srv = _serve(tok, ["ok"])
    with srv as server:
        _client(server).chat.completions.create(model="starter", messages=USER, tools=TOOLS)
        assert tok.decode(engine.calls[0][0][0]) == tk.render_chat(tok, USER, TOOLS, add_generation_prompt=True)


def test_reasoning_goes_to_reasoning_content_and_an_empty_think_never_stays_in_content(tok):
    for reply, content, reasoning in [("<think>\n\n</think>\n\nIt is 7.", "It is 7.", None),
                                      ("<think>\nThe user asks.\n</think>\n\nIt is 7.", "It is 7.", "The user asks.")]:
        _, srv = _serve(tok, [reply])
        with srv as server:
            c = _client(server)
            m = c.chat.completions.create(model="starter", messages=USER).choices[0].message
            assert m.content == content and getattr(m, "reasoning_content", None) == reasoning, m
            got, thought, calls, finish = _stream(c, model="starter", messages=USER)
            assert got == content and thought == (reasoning or "") and not calls and finish == "stop"


def test_calls_to_tools_not_offered_come_back_as_text(tok):
    bad = "<think>\n\n</think>\n\n" + tk.format_tool_call("send_money", {"to": "x", "amount": 5})
    for tools in (TOOLS, None):
        _, srv = _serve(tok, [bad])
        with srv as server:
            c = _client(server)
            kw = {"tools": tools} if tools else {}
            ch = c.chat.completions.create(model="starter", messages=USER, **kw).choices[0]
            assert not ch.message.tool_calls and ch.finish_reason == "stop"
            assert ch.message.content == tk.format_tool_call("send_money", {"to": "x", "amount": 5})  # no <think> block
            content, _, calls, finish = _stream(c, model="starter", messages=USER, **kw)
            assert content == ch.message.content and not calls and finish == "stop"
    # One offered call and one not: the whole answer is text (a client must not run half of it).
    mixed = tk.format_tool_call("set_alarm", {"time": "7"}) + "\n" + tk.format_tool_call("send_money", {"to": "x"})
    _, srv = _serve(tok, [mixed])
    with srv as server:
        ch = _client(server).chat.completions.create(model="starter", messages=USER, tools=TOOLS).choices[0]
        assert not ch.message.tool_calls and "send_money" in ch.message.content


def test_tool_choice_required_and_named_force_the_call_opening(tok):
    # The model's text continues the forced opening; the server prepends the opening before parsing.
    for choice, fmt, rest in [
        ({"type": "function", "function": {"name": "get_weather"}}, COMPACT, ' {"city": "Oslo"}}\n</tool_call>'),
        ("required", COMPACT, 'set_alarm", "arguments": {"time": "07:00"}}\n</tool_call>'),
        ("required", ContextFormat("json", "full"), 'set_alarm", "arguments": {"time": "07:00"}}\n</tool_call>'),
    ]:
        engine, srv = _serve(tok, [rest], context=fmt)
        with srv as server:
            c = _client(server)
            r = c.chat.completions.create(model="starter", messages=USER, tools=TOOLS, tool_choice=choice, temperature=0)
            (call,) = r.choices[0].message.tool_calls
            want = ("get_weather", {"city": "Oslo"}) if isinstance(choice, dict) else ("set_alarm", {"time": "07:00"})
            assert (call.function.name, json.loads(call.function.arguments)) == want
            assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
            prompt = tok.decode(engine.calls[0][0][0])
            head = "<|im_start|>assistant\n" + ("" if fmt.reasoning == "none" else "<think>\n\n</think>\n\n") + '<tool_call>\n{"name": "'
            assert head in prompt and prompt.endswith(('"arguments":', '"name": "')), prompt[-80:]
            assert prompt.endswith('"arguments":') == isinstance(choice, dict)
            _, _, calls, finish = _stream(c, model="starter", messages=USER, tools=TOOLS, tool_choice=choice)
            assert finish == "tool_calls" and [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [want]
            with pytest.raises(openai.BadRequestError, match="tool_choice"):
                c.chat.completions.create(model="starter", messages=USER, tools=TOOLS,
                                          tool_choice={"type": "function", "function": {"name": "nope"}})


def test_parallel_tool_calls_false_keeps_the_first_call(tok):
    two = tk.format_tool_call("set_alarm", {"time": "7"}) + "\n" + tk.format_tool_call("get_weather", {"city": "Oslo"})
    _, srv = _serve(tok, [two])
    with srv as server:
        c = _client(server)
        assert len(c.chat.completions.create(model="starter", messages=USER, tools=TOOLS).choices[0].message.tool_calls) == 2
        one = c.chat.completions.create(model="starter", messages=USER, tools=TOOLS, parallel_tool_calls=False)
        assert [t.function.name for t in one.choices[0].message.tool_calls] == ["set_alarm"]
        _, _, calls, _ = _stream(c, model="starter", messages=USER, tools=TOOLS, parallel_tool_calls=False)
        assert [v["name"] for v in calls.values()] == ["set_alarm"]


def test_served_model_name_unknown_model_is_404_and_harmless_fields_are_accepted(tok):
    _, srv = _serve(tok, ["Sure."])
    with srv as server:
        c = _client(server)
        assert [m.id for m in c.models.list().data] == ["starter"]
        with pytest.raises(openai.NotFoundError) as e:
            c.chat.completions.create(model="gpt-4o", messages=USER)
        err = e.value.body
        assert err["code"] == 404 and err["param"] == "model" and "gpt-4o" in err["message"] and "starter" in err["message"]
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="gpt-4o", prompt="x")
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-4o")
        # What the Agents SDK, inspect-ai and other clients send (vLLM and SGLang accept these).
        r = c.chat.completions.create(
            model="starter", messages=USER, tools=TOOLS, tool_choice="auto", parallel_tool_calls=True, metadata={"run": "1"},
            store=False, user="u1", service_tier="auto", reasoning_effort="low", presence_penalty=0.5, frequency_penalty=-0.3,
            extra_body={"verbosity": "low", "prompt_cache_key": "k", "safety_identifier": "s",
                        "chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].message.content == "Sure." and r.model == "starter"
        # A body without `model` is the served model.
        body = httpx.post(server.url + "/v1/chat/completions", json={"messages": USER}).json()
        assert body["model"] == "starter" and body["choices"][0]["message"]["content"] == "Sure."
