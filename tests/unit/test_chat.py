"""Chat format: rendering parity with transformers on the Qwen3 template, loss masks, token-in/token-out."""
import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from mpa_jax.tokenizer import (
    ChatSession,
    ChatTemplateError,
    append_messages,
    assistant_spans,
    build_tokenizer,
    encode_chat,
    format_tool_call,
    generation_prompt_ids,
    render_chat,
    synthetic_corpus,
)

# An outside fixture the repository does not carry: the official Qwen3 chat template in ../shared beside the
# clone. A user's clone without it skips the parity test, saying so in one line; CI (which always has it, and
# sets CI) runs it and fails when it is missing.
FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "chat_templates" / "qwen3.jinja"
QWEN3 = FIXTURE.read_text() if FIXTURE.is_file() else None
needs_qwen3_fixture = pytest.mark.skipif(QWEN3 is None and not os.environ.get("CI"),
                                         reason=f"outside fixture missing: {FIXTURE} (the official Qwen3 chat template; CI has it)")
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(synthetic_corpus(n=150), 1024, str(d))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    from mpa_jax.tokenizer import load_tokenizer

    return load_tokenizer(str(tok_dir))


@pytest.fixture(scope="module")
def hf_tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


# ---- conversation strategies --------------------------------------------------------------------------------
# Text mixes words, JSON-ish punctuation, newlines, unicode, and sometimes tool/think markup.
chunk = st.sampled_from(["hello", " world", "\n", "\n\n", "  ", "{\"a\": 1}", "é", "日本語", "🙂", "'s", "42", "<b>", "tab\t", "x"])
plain = st.lists(chunk | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="<|"), max_size=8), max_size=6).map("".join)
words = st.lists(st.sampled_from(["call", "the", "contact", "Alex", "70", "kg", "ok", "done", "é", "{x}", "\"q\""]), min_size=1, max_size=6).map(" ".join)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
json_leaf = st.none() | st.booleans() | st.integers(-1000, 10**6) | st.floats(-1e6, 1e6, allow_nan=False) | plain
arguments = st.dictionaries(names, st.recursive(json_leaf, lambda c: st.lists(c, max_size=2) | st.dictionaries(names, c, max_size=2), max_leaves=4), max_size=3)
tool_specs = st.lists(
    st.builds(lambda n, d: {"type": "function", "function": {"name": n, "description": d,
              "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}, names, plain),
    max_size=3,
)


@st.composite
def tool_call(draw):
    args = draw(arguments)
    if draw(st.integers(0, 9)) == 0:
        args = format_tool_call("f", args)[len('<tool_call>\n{"name": "f", "arguments": '):-len("}\n</tool_call>")]
    return {"type": "function", "function": {"name": draw(names), "arguments": args}}


@st.composite
def conversation(draw, text=plain, clean=False):
    """OpenAI-style chat: optional system, 1-3 user queries, each followed by tool rounds and maybe an answer.

    clean=True: no markup inside texts and no assistant text starting with whitespace (token boundaries of
    sampled turns then fall where the header ends, as when a model samples them).
    """
    def assistant_text():
        t = draw(text)
        return t.lstrip() if clean else t

    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(text)})
    n_queries = draw(st.integers(1, 3))
    for q in range(n_queries):
        content = draw(text)
        if not clean and draw(st.integers(0, 9)) == 0:
            content = "<tool_response>" + content + "</tool_response>"  # tool text sent as a user turn
        msgs.append({"role": "user", "content": content})
        for _ in range(draw(st.integers(0, 3))):
            calls = draw(st.lists(tool_call(), min_size=1, max_size=3))
            a = {"role": "assistant", "content": assistant_text(), "tool_calls": calls}
            r = draw(st.sampled_from([None, "", "plan"]))
            if r == "plan":
                a["reasoning_content"] = draw(text)
            elif r == "":
                a["reasoning_content"] = ""
            if not clean and r is None and draw(st.integers(0, 4)) == 0:
                a["content"] = "<think>\n" + draw(text) + "\n</think>\n\n" + a["content"]
            elif not clean and draw(st.integers(0, 5)) == 0:
                a["content"] = None  # OpenAI clients send null content beside tool calls
            msgs.append(a)
            for _ in calls:
                msgs.append({"role": "tool", "content": draw(text)})
        last = q == n_queries - 1
        if not last or draw(st.booleans()):
            a = {"role": "assistant", "content": assistant_text()}
            if draw(st.booleans()):
                a["reasoning_content"] = draw(text)
            msgs.append(a)
    if draw(st.integers(0, 5)) == 0 and msgs[-1]["role"] == "assistant":
        msgs.append({"role": "system", "content": draw(text)})  # a system turn later in the chat
    return msgs


@st.composite
def episode(draw):
    """One agent episode as a model produces it: one user query, then turns that each start with reasoning
    (tool calls answered by tool results), ending with an answer or cut off after tool results."""
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(plain)})
    msgs.append({"role": "user", "content": draw(plain)})
    for _ in range(draw(st.integers(0, 3))):
        calls = draw(st.lists(tool_call(), min_size=1, max_size=3))
        msgs.append({"role": "assistant", "content": draw(plain).strip(), "reasoning_content": draw(plain).strip("\n") or "x", "tool_calls": calls})
        msgs += [{"role": "tool", "content": draw(plain)} for _ in calls]
    if len(msgs) < 3 or draw(st.booleans()):
        msgs.append({"role": "assistant", "content": draw(plain).strip(), "reasoning_content": draw(plain).strip("\n") or "x"})
    return msgs


# ---- rendering parity -----------------------------------------------------------------------------------------
@needs_qwen3_fixture
@HYP
@given(msgs=conversation(), tools=tool_specs, agp=st.booleans(), thinking=st.sampled_from([None, True, False]))
def test_render_matches_transformers_on_the_qwen3_fixture(hf_tok, tok, msgs, tools, agp, thinking):
    assert QWEN3 is not None, f"outside fixture missing: {FIXTURE}"
    kw = {} if thinking is None else {"enable_thinking": thinking}
    want = hf_tok.apply_chat_template(msgs, tools=tools or None, tokenize=False, add_generation_prompt=agp, chat_template=QWEN3, **kw)
    assert render_chat(tok, msgs, tools or None, add_generation_prompt=agp, chat_template=QWEN3, **kw) == want
    # The project's own template renders the same strings.
    assert render_chat(tok, msgs, tools or None, add_generation_prompt=agp, **kw) == want


def test_own_template_is_carried_by_the_tokenizer_and_transformers_uses_it(hf_tok, tok):
    msgs = [{"role": "user", "content": "convert 70 kg"},
            {"role": "assistant", "content": "", "reasoning_content": "use the converter",
             "tool_calls": [{"type": "function", "function": {"name": "convert_units", "arguments": {"value": 70}}}]},
            {"role": "tool", "content": "{\"ok\":true}"}]
    assert hf_tok.chat_template == tok.chat_template != QWEN3
    assert render_chat(tok, msgs, add_generation_prompt=True) == hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # A system message without text renders as an empty system turn (the fixture would fail on it).
    assert render_chat(tok, [{"role": "system", "content": None}, {"role": "user", "content": "x"}]) == \
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"


def test_hf_template_features_render_as_in_transformers(hf_tok, tok):
    # {% generation %} markers, loopcontrols, namespace, tojson options, special-token variables.
    tpl = ("{{ bos_token or '' }}{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
           "{% endif %}{% set ns.n = ns.n + 1 %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}"
           "{% endgeneration %}{% else %}{{ m | tojson(indent=1, sort_keys=True) }}{% endif %}{% endfor %}{{ ns.n }}{{ extra }}")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "é<b>"}, {"role": "assistant", "content": "a"}]
    want = hf_tok.apply_chat_template(msgs, tokenize=False, chat_template=tpl, extra="!")
    assert render_chat(tok, msgs, chat_template=tpl, extra="!") == want


def test_bad_messages_give_one_clear_error(tok):
    cases = [
        ([], "empty"),
        ("hi", "list"),
        ([{"role": "robot", "content": "x"}], "role 'robot'"),
        ([{"role": "user", "content": 3}], "content must be a string"),
        ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}], "only assistant"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}], "function name"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}], "arguments"),
    ]
    for msgs, needle in cases:
        with pytest.raises(ChatTemplateError, match=needle):
            render_chat(tok, msgs)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat(tok, [{"role": "user", "content": "x"}], chat_template="{% if %}")
    with pytest.raises(ChatTemplateError, match="boom"):
        render_chat(tok, [{"role": "user", "content": "x"}], chat_template="{{ raise_exception('boom') }}")


# ---- loss masks ------------------------------------------------------------------------------------------------
@HYP
@example(msgs=[{"role": "user", "content": ""}, {"role": "assistant", "content": "\uf900", "tool_calls": [{'type': 'function', 'function': {'name': '_', 'arguments': '{}'}}]}, {"role": "tool", "content": ""}], tools=[])  # a CJK compatibility ideograph: NFC changes it
@given(msgs=conversation(clean=True), tools=tool_specs)
def test_loss_mask_covers_exactly_the_assistant_generated_text(tok, msgs, tools):
    ids, mask = encode_chat(tok, msgs, tools or None)
    text = render_chat(tok, msgs, tools or None)
    assert ids == tok.encode(text) and len(mask) == len(ids)
    spans = assistant_spans(text)
    assert len(spans) == sum(m["role"] == "assistant" for m in msgs)
    # Runs of mask 1 decode to the assistant turns (content, <think>, <tool_call>s, <|im_end|>), in order.
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    # The tokenizer normalises text to NFC (as Qwen's does), so compatibility characters decode as their NFC form.
    assert [tok.decode(r) for r in runs] == [unicodedata.normalize("NFC", text[s:e]) for s, e in spans]
    im_end = tok.token_id("<|im_end|>")
    for t in range(len(ids)):
        if mask[t] and ids[t] == im_end and t + 1 < len(ids):
            assert mask[t + 1] == 0  # the newline the template writes after <|im_end|> is not learned
    assert tok.decode([i for i, m in zip(ids, mask) if not m]).count("<|im_start|>assistant\n") == len(spans)


def test_loss_mask_example(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]
    ids, mask = encode_chat(tok, msgs)
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "<think>\ngreet\n</think>\n\nhello<|im_end|>"
    assert tok.decode(ids).endswith("<|im_end|>\n") and mask[-1] == 0


# ---- token-in/token-out ----------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(msgs=conversation(clean=True), tools=tool_specs)
def test_incremental_rendering_equals_tokenising_the_full_conversation(tok, msgs, tools):
    tools = tools or None
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    assume(assistants)
    ends_open = msgs[-1]["role"] != "assistant"
    full_text = render_chat(tok, msgs, tools, add_generation_prompt=ends_open)
    full_ids, offsets = tok.encode_with_offsets(full_text)
    spans = assistant_spans(full_text)

    ids = generation_prompt_ids(tok, msgs[: assistants[0]], tools)
    for k, a in enumerate(assistants):
        assert ids == full_ids[: len(ids)]
        # What the model "sampled" for this turn: exactly the tokens of its span.
        s, e = spans[k]
        sampled = [i for i, (o, _) in zip(full_ids, offsets) if s <= o < e]
        ids = ids + sampled
        nxt = assistants[k + 1] if k + 1 < len(assistants) else len(msgs)
        if nxt > a + 1:
            ids = append_messages(tok, ids, msgs[: a + 1], msgs[a + 1 : nxt], tools, add_generation_prompt=nxt < len(msgs) or ends_open)
    if not ends_open:
        ids = ids + tok.encode("\n")  # the template's newline after the final <|im_end|> (never sampled)
    assert ids == full_ids


def test_session_keeps_sampled_tokens_and_matches_the_rendered_episode(tok):
    tools = [{"type": "function", "function": {"name": "convert_units", "description": "units", "parameters": {"type": "object"}}}]
    msgs = [{"role": "system", "content": "You are a phone assistant."}, {"role": "user", "content": "70 kg in lb?"}]
    s = ChatSession(tok, msgs, tools)
    assert s.ids == tok.encode(render_chat(tok, msgs, tools, add_generation_prompt=True)) and not any(s.loss_mask)
    out1 = "<think>\nTwo conversions are needed.\n</think>\n\n" + format_tool_call("convert_units", {"value": 70, "unit": "kg"}) \
        + "\n" + format_tool_call("convert_units", {"value": 70, "unit": "kilograms"}) + "<|im_end|>"
    parsed = s.add_sampled(tok.encode(out1))
    assert parsed.ok and [c.arguments["unit"] for c in parsed.calls] == ["kg", "kilograms"]
    new = s.add_messages([{"role": "tool", "content": "{\"error\":\"UNSUPPORTED_VALUE\"}"}, {"role": "tool", "content": "{\"value\":154.32}"}])
    # Two consecutive tool results share one user turn, then the next generation prompt.
    assert tok.decode(new) == "\n<|im_start|>user\n<tool_response>\n{\"error\":\"UNSUPPORTED_VALUE\"}\n</tool_response>\n" \
        "<tool_response>\n{\"value\":154.32}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    s.add_sampled(tok.encode("<think>\nDone.\n</think>\n\nIt is 154.32 lb.<|im_end|>"))
    assert s.turn_closed
    # With reasoning on every turn of one query the Qwen3 template is prefix-stable, so the episode's ids equal
    # the tokens of the re-rendered chat and the mask equals encode_chat's.
    ids, mask = encode_chat(tok, s.messages, tools)
    assert s.ids == ids[:-1] and s.loss_mask == mask[:-1]  # encode_chat adds the trailing "\n"
    with pytest.raises(ChatTemplateError, match="<\\|im_end\\|>"):
        append_messages(tok, s.ids[:-1], s.messages, [{"role": "user", "content": "x"}])


def test_later_query_drops_earlier_reasoning_but_sampled_tokens_stay(tok):
    # Qwen3 drops reasoning of turns before the last user query when re-rendering; token-in/token-out keeps what
    # was sampled and appends only the new turns.
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r"}]
    ids = tok.encode(render_chat(tok, msgs))[:-1]  # the sampled turn ends with <|im_end|>
    new = [{"role": "user", "content": "c"}]
    got = append_messages(tok, ids, msgs, new)
    rerendered = tok.encode(render_chat(tok, msgs + new, add_generation_prompt=True))
    assert got != rerendered and "<think>\nr\n</think>" in tok.decode(got) and "r\n</think>" not in tok.decode(rerendered)
    assert tok.decode(got).endswith("<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n")


@HYP
@example(msgs=[{"role": "user", "content": ""}, {"role": "assistant", "content": "", "reasoning_content": "\U0002f800", "tool_calls": [{'type': 'function', 'function': {'name': '_', 'arguments': '{}'}}]}, {"role": "tool", "content": ""}], tools=[])
@given(msgs=episode(), tools=tool_specs)
def test_session_over_an_episode_matches_encode_chat(tok, msgs, tools):
    # What the rollout records (ChatSession) and what SFT trains on (encode_chat) are the same tokens and mask.
    tools = tools or None
    ends_open = msgs[-1]["role"] != "assistant"
    text = render_chat(tok, msgs, tools, add_generation_prompt=ends_open)
    spans = iter(assistant_spans(text))
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    session = ChatSession(tok, msgs[:first], tools)
    pending = []
    for i, m in enumerate(msgs[first:], first):
        if m["role"] != "assistant":
            pending.append(m)
            continue
        if pending:
            session.add_messages(pending)
            pending = []
        s, e = next(spans)
        parsed = session.add_sampled(tok.encode(text[s:e]))
        nfc = lambda x: unicodedata.normalize("NFC", x)  # noqa: E731  (the tokenizer's normaliser)
        assert parsed.ok and parsed.reasoning == nfc(m["reasoning_content"]).strip("\n") and parsed.content == nfc(m["content"])
        assert [c.name for c in parsed.calls] == [c["function"]["name"] for c in m.get("tool_calls", [])]
    if pending:
        session.add_messages(pending)
    ids, mask = encode_chat(tok, msgs, tools)
    if ends_open:
        assert session.ids == tok.encode(text)
        assert session.ids[: len(ids)] == ids and session.loss_mask[: len(mask)] == mask and not any(session.loss_mask[len(mask):])
    else:
        assert session.ids + tok.encode("\n") == ids and session.loss_mask + [0] == mask
