"""`Tokenizer`: a `tokenizers.Tokenizer` plus its Hugging Face tokenizer_config and chat template.

Loads any Hugging Face tokenizer directory offline (tokenizer.json + tokenizer_config.json, with the chat
template inline, in chat_template.jinja, or in chat_template.json) and saves in the same layout, so that
`transformers.AutoTokenizer.from_pretrained(dir)` reads what we write. No jax, no transformers.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

import tokenizers

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class TokenizerError(ValueError):
    """A tokenizer directory or token could not be used; the message names what was wrong."""


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class Tokenizer:
    """Text <-> ids for one vocabulary, with the chat template that goes with it.

    `encode` recognises special tokens written in the text (as Hugging Face does) and adds none of its own.
    """

    def __init__(self, backend: tokenizers.Tokenizer, config: dict[str, Any], chat_template: str | None,
                 generation_eos: Sequence[int] = ()):
        self._tk = backend
        self.config = dict(config)
        self.chat_template = chat_template or ""
        vocab = backend.get_vocab(with_added_tokens=True)
        self._vocab = vocab
        # Highest id + 1: the embedding rows a model needs (added tokens may leave holes).
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0

        eos = []
        for name in (_token_content(config.get("eos_token")), IM_END, ENDOFTEXT):
            if name is not None and name in vocab and vocab[name] not in eos:
                eos.append(vocab[name])
        for i in generation_eos:
            if i not in eos and 0 <= i < self.vocab_size:
                eos.append(int(i))
        self.eos_token_ids: list[int] = eos

        pad = _token_content(config.get("pad_token"))
        if pad is not None and pad in vocab:
            self.pad_id: int = vocab[pad]
        elif ENDOFTEXT in vocab:
            self.pad_id = vocab[ENDOFTEXT]
        elif eos:
            self.pad_id = eos[0]
        else:
            self.pad_id = 0
        self._special_ids = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}

    # ---- text <-> ids -------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text are recognised, nothing is added."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts (the Rust side runs them in parallel)."""
        return [e.ids for e in self._tk.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's (start, end) character span in `text`."""
        e = self._tk.encode(text, add_special_tokens=False)
        return e.ids, e.offsets

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; with `skip_special_tokens` the special tokens (not <tool_call>/<think>) are dropped."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise TokenizerError(f"token id {bad} is outside the vocabulary (size {self.vocab_size})")
        return self._tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_each(self, ids: Iterable[int]) -> list[str]:
        """Text of each id on its own (one backend call for all: per-token pieces of a long output)."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise TokenizerError(f"token id {bad} is outside the vocabulary (size {self.vocab_size})")
        return self._tk.decode_batch([[i] for i in ids], skip_special_tokens=False)

    def has_token(self, token: str) -> bool:
        """True when `token` is one token of the vocabulary."""
        return token in self._vocab

    def token_id(self, token: str) -> int:
        """Id of one token string (e.g. '<|im_end|>'); raises TokenizerError when it is not in the vocabulary."""
        i = self._vocab.get(token)
        if i is None:
            raise TokenizerError(f"token {token!r} is not in the vocabulary")
        return i

    def id_to_token(self, i: int) -> str:
        """The token string of one id."""
        t = self._tk.id_to_token(int(i))
        if t is None:
            raise TokenizerError(f"token id {i} is not in the vocabulary")
        return t

    @property
    def special_ids(self) -> set[int]:
        """Ids of special tokens (those `decode(skip_special_tokens=True)` drops)."""
        return set(self._special_ids.values())

    def special_tokens_map(self) -> dict[str, str]:
        """bos/eos/pad/unk token strings from the config (what chat templates may read)."""
        out = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = _token_content(self.config.get(key))
            if v is not None:
                out[key] = v
        return out

    def __len__(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tk

    # ---- files --------------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write tokenizer.json, tokenizer_config.json and chat_template.jinja (the layout transformers 5 writes)."""
        os.makedirs(path, exist_ok=True)
        self._tk.save(os.path.join(path, "tokenizer.json"))
        config = {k: v for k, v in self.config.items() if k != "chat_template"}
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False, sort_keys=True)
            f.write("\n")
        if self.chat_template:
            with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(self.chat_template)


def load_tokenizer(path: str) -> Tokenizer:
    """Load a Hugging Face tokenizer directory offline (tokenizer.json required)."""
    if not os.path.isdir(path):
        raise TokenizerError(f"tokenizer directory {path!r} does not exist")
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tj):
        raise TokenizerError(f"{path!r} has no tokenizer.json (only fast tokenizers are supported)")
    try:
        backend = tokenizers.Tokenizer.from_file(tj)
    except Exception as e:  # the Rust error type is not exported
        raise TokenizerError(f"{tj}: cannot be read as a tokenizer ({e})") from None
    config = _read_json(os.path.join(path, "tokenizer_config.json"), default={})
    template = _find_chat_template(path, config)
    gen = _read_json(os.path.join(path, "generation_config.json"), default={})
    gen_eos = gen.get("eos_token_id", [])
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else [i for i in gen_eos if isinstance(i, int)]
    return Tokenizer(backend, config, template, generation_eos=gen_eos)


def _read_json(path: str, default: Any) -> Any:
    if not os.path.isfile(path):
        return default
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _find_chat_template(path: str, config: dict[str, Any]) -> str | None:
    """chat_template.jinja, then chat_template.json, then tokenizer_config.json (as transformers looks)."""
    jinja_file = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    data = _read_json(os.path.join(path, "chat_template.json"), default={}).get("chat_template")
    if data is None:
        data = config.get("chat_template")
    if isinstance(data, list):  # named templates: [{"name": ..., "template": ...}]
        named = {d.get("name"): d.get("template") for d in data if isinstance(d, dict)}
        data = named.get("default") or next(iter(named.values()), None)
    return data if isinstance(data, str) else None
