"""Text the project BPE is trained on, and `project_tokenizer` (build once per run directory).

The corpus is the project's own text: tool specs and rendered oracle episodes from `mpa_jax.envs` when that
package provides them, plus synthetic phone-assistant conversations rendered with the chat template (both
tool-call formats), so the BPE learns the chat, JSON and tool-call structure even without envs.
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, Iterator

from mpa_jax.tokenizer.build import build_tokenizer, is_tokenizer_dir
from mpa_jax.tokenizer.core import Tokenizer, load_tokenizer
from mpa_jax.tokenizer.template import QWEN3_CHAT_TEMPLATE, render_chat
from mpa_jax.tokenizer.toolcall import format_tool_call

_BUILD_META = "mpa_build.json"

# (tool name, description, {param: (json type, example values)}) for a spread of phone apps.
_TOOLS: list[tuple[str, str, dict[str, tuple[str, list[Any]]]]] = [
    ("send_message", "Send a text message to a contact.", {"contact": ("string", ["Alex", "Coach Sam", "Mum", "Priya"]), "text": ("string", ["Running late, be there in 10", "154.32 lb", "See you at 7pm"])}),
    ("search_contacts", "Search the address book by name.", {"query": ("string", ["Alex", "coach", "dentist", "Li"])}),
    ("convert_units", "Convert a value between units.", {"value": ("number", [70, 5.5, 120, 1000]), "from_unit": ("string", ["kg", "km", "celsius", "ml"]), "to_unit": ("string", ["lb", "mi", "fahrenheit", "cup"])}),
    ("calculate", "Evaluate an arithmetic expression.", {"expression": ("string", ["70 * 2.20462", "(18 + 24) / 2", "120 * 0.15"])}),
    ("create_event", "Create a calendar event.", {"title": ("string", ["Dentist", "Team sync", "Yoga"]), "start": ("string", ["2026-03-02T09:00", "2026-03-05T18:30"]), "duration_min": ("integer", [30, 45, 60])}),
    ("set_alarm", "Set an alarm.", {"time": ("string", ["06:30", "07:15", "22:00"]), "label": ("string", ["Gym", "Meds", "Wake up"]), "repeat": ("array", [["mon", "wed", "fri"], []])}),
    ("create_note", "Create a note.", {"title": ("string", ["Groceries", "Ideas"]), "body": ("string", ["milk, eggs, bread", "call the bank about the card"])}),
    ("get_route", "Plan a route between two places.", {"origin": ("string", ["home", "work", "Central Station"]), "destination": ("string", ["airport", "gym", "Main St 12"]), "mode": ("string", ["driving", "walking", "transit"])}),
    ("order_food", "Order food from a restaurant.", {"restaurant": ("string", ["Pizza Roma", "Green Bowl"]), "items": ("array", [["margherita", "cola"], ["salad"]]), "tip_percent": ("integer", [10, 15])}),
    ("transfer_money", "Transfer money to a payee.", {"payee": ("string", ["Alex", "Landlord"]), "amount": ("number", [25.5, 1200, 40]), "currency": ("string", ["EUR", "USD", "GBP"])}),
    ("search_flights", "Search flights.", {"origin": ("string", ["LHR", "SFO", "BER"]), "destination": ("string", ["JFK", "NRT", "MAD"]), "date": ("string", ["2026-04-11", "2026-05-01"])}),
    ("log_workout", "Log a workout.", {"activity": ("string", ["run", "swim", "cycling"]), "minutes": ("integer", [30, 45, 90]), "distance_km": ("number", [5.2, 1.5, 40])}),
    ("play_media", "Play a song, album or podcast.", {"query": ("string", ["jazz for work", "Abbey Road", "daily news"]), "shuffle": ("boolean", [True, False])}),
    ("set_setting", "Change a device setting.", {"setting": ("string", ["wifi", "bluetooth", "do_not_disturb", "brightness"]), "value": ("string", ["on", "off", "70"])}),
    ("get_weather", "Get the weather forecast.", {"city": ("string", ["Berlin", "Lisbon", "Tokyo"]), "days": ("integer", [1, 3, 7])}),
]
_ASKS = [
    "Can you {verb} for me?", "Please {verb}.", "I need you to {verb}, thanks!", "{verb_cap} right away.",
    "Hey, could you {verb}? It's urgent.", "Quick one: {verb}.",
]
_ERRORS = ["INVALID_ARGUMENTS", "NOT_FOUND", "AMBIGUOUS", "PRECONDITION_FAILED", "UNSUPPORTED_VALUE", "TRANSIENT"]
_THOUGHTS = [
    "The user wants me to {verb}. I should call {tool} with the right arguments.",
    "First I look up what I need, then I {verb}.",
    "The last call failed with {err}; the hint says to change the value, so I retry with another one.",
    "I have everything now, so I can answer the user.",
]


def _spec(name: str, desc: str, params: dict[str, tuple[str, list[Any]]]) -> dict[str, Any]:
    props = {}
    for p, (typ, _vals) in params.items():
        props[p] = {"type": typ, "description": p.replace("_", " ")}
        if typ == "array":
            props[p]["items"] = {"type": "string"}
    return {"type": "function", "function": {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(params), "additionalProperties": False}}}


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One synthetic episode: system, user request, 1-3 tool rounds (some failing), final answer."""
    tools = rng.sample(_TOOLS, k=rng.randint(2, 5))
    specs = [_spec(*t) for t in tools]
    name, desc, params = tools[0]
    verb = desc.rstrip(".").lower()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a phone assistant. Today is 2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}."},
        {"role": "user", "content": rng.choice(_ASKS).format(verb=verb, verb_cap=verb.capitalize())},
    ]
    for round_ in range(rng.randint(1, 3)):
        calls = []
        for tname, _d, tparams in rng.sample(tools, k=rng.randint(1, min(2, len(tools)))):
            args = {p: rng.choice(vals) for p, (_t, vals) in tparams.items()}
            calls.append({"type": "function", "function": {"name": tname, "arguments": args}})
        msg: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
        if rng.random() < 0.7:
            msg["reasoning_content"] = rng.choice(_THOUGHTS).format(verb=verb, tool=name, err=rng.choice(_ERRORS))
        messages.append(msg)
        for call in calls:
            if rng.random() < 0.25:
                result = {"status": "error", "error_code": rng.choice(_ERRORS), "message": "the value is not accepted",
                          "hint": "use one of the supported values"}
            else:
                result = {"status": "ok", "result": {"id": rng.randint(1, 999), "done": True, "summary": call["function"]["name"]}}
            messages.append({"role": "tool", "content": json.dumps(result, sort_keys=True, separators=(",", ":"))})
    messages.append({"role": "assistant", "content": f"Done: I {verb.split()[0]} it as you asked.",
                     "reasoning_content": rng.choice(_THOUGHTS[-1:])})
    return messages, specs


def synthetic_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """`n` rendered synthetic conversations plus tool calls in the XML (Qwen3.5) form; deterministic in seed."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        messages, specs = _conversation(rng)
        texts.append(render_chat(None, messages, specs, chat_template=QWEN3_CHAT_TEMPLATE))
        for m in messages:
            for call in m.get("tool_calls", []):
                texts.append(format_tool_call(call["function"]["name"], call["function"]["arguments"], style="xml"))
    return texts


def _envs_corpus(split: str, max_tasks: int, context: Any = None) -> Iterator[str]:
    """Text from mpa_jax.envs: instructions and histories, and the oracle episodes rendered in chat format in
    the run's context format (`envs.context.ContextFormat`; default json/full): the text the model will see."""
    if max_tasks <= 0:
        return
    from mpa_jax import envs  # no jax: the tokenizer stays light
    from mpa_jax.envs.context import ContextFormat

    context = context or ContextFormat()
    tasks = list(envs.load_tasks(split))
    tasks = tasks[:: max(1, len(tasks) // max_tasks)][:max_tasks]  # a spread over domains and templates
    env = envs.make_env("sandbox", context=context)
    try:
        for i, task in enumerate(tasks):
            yield task.instruction
            for turn in task.history:
                yield json.dumps(turn, ensure_ascii=False)
            ep = envs.run_oracle_episode(env, task, seed=i, reasoning=context.reasoning)
            yield render_chat(None, ep.messages, ep.tools, chat_template=QWEN3_CHAT_TEMPLATE)
    finally:
        env.close()


def project_corpus(split: str = "train", max_tasks: int = 300, seed: int = 0, context: Any = None) -> list[str]:
    """The project's text for BPE training: envs episodes (`max_tasks` of them; 0 for none), plus the synthetic corpus."""
    return list(_envs_corpus(split, max_tasks, context)) + synthetic_corpus(seed=seed)


def build_project_tokenizer(vocab_size: int, out_dir: str, split: str = "train", seed: int = 0,
                            max_tasks: int = 300, require_tasks: bool = False,
                            context: Any = None) -> tuple[Tokenizer, dict[str, Any]]:
    """Build the project BPE into `out_dir` from `project_corpus`; returns it and build facts (also saved
    as mpa_build.json, which `tokenizer_for_config` checks before reusing the directory).

    `require_tasks`: raise ValueError when envs gives no text for `split` instead of using synthetic text only.
    """
    from mpa_jax.envs.context import ContextFormat

    context = context or ContextFormat()
    envs_texts = list(_envs_corpus(split, max_tasks, context))
    if require_tasks and not envs_texts:
        raise ValueError(f"mpa_jax.envs gave no tasks for split {split!r} (is load_tasks available?)")
    synth = synthetic_corpus(seed=seed)
    tok = build_tokenizer(envs_texts + synth, vocab_size, out_dir)
    meta = {"vocab_size": vocab_size, "split": split, "seed": seed, "context": context.to_dict(), "envs_texts": len(envs_texts),
            "synthetic_texts": len(synth), "tokens": len(tok)}
    with open(os.path.join(out_dir, _BUILD_META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    return tok, meta


def project_tokenizer(config: Any, workdir: str) -> Tokenizer:
    """The project BPE of `config.tokenizer.vocab_size` ids, built into `<workdir>/tokenizer` once and
    reused while its size matches (from-scratch models only: `tokenizer.select` picks a pretrained
    checkpoint's own tokenizer first)."""
    from mpa_jax.envs.context import ContextFormat

    vocab_size = int(config.tokenizer.vocab_size)
    # a tokenizer-only config (no context section) renders its corpus in the default json/full format
    context = ContextFormat.from_config(config) if "context" in config else ContextFormat()
    out = os.path.join(workdir, "tokenizer")
    meta_path = os.path.join(out, _BUILD_META)
    if is_tokenizer_dir(out) and os.path.isfile(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        # a directory built before the format was recorded is taken as built for this run's format
        if meta.get("vocab_size") == vocab_size and meta.get("context", context.to_dict()) == context.to_dict():
            return load_tokenizer(out)
    tok, _ = build_project_tokenizer(vocab_size, out, split=str(config.oracle.split) if "oracle" in config else "train",
                                     seed=int(config.seed),
                                     max_tasks=int(config.tokenizer.corpus_tasks), context=context)
    return tok


__all__ = ["build_project_tokenizer", "project_corpus", "project_tokenizer", "synthetic_corpus"]
