"""Build the project's byte-level BPE tokenizer (Qwen2-style pre-tokenizer, Qwen special tokens)."""
from __future__ import annotations

import os
from typing import Iterable

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, trainers

from mpa_jax.tokenizer.core import ENDOFTEXT, IM_END, IM_START, Tokenizer
from mpa_jax.tokenizer.template import QWEN3_CHAT_TEMPLATE

# Control tokens (special: dropped by decode(skip_special_tokens=True)) and the markup tokens the Qwen3 tokenizer
# keeps as non-special added tokens (they stay in decoded text, where tool-call parsing needs them).
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
SPECIAL_TOKENS = CONTROL_TOKENS + MARKUP_TOKENS

# Qwen2's split: contractions, letter runs with one leading non-letter, single digits, punctuation runs,
# newline runs, other whitespace. Single digits keep numbers compositional in a small vocabulary.
_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + 16


def _empty_tokenizer() -> tokenizers.Tokenizer:
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    return tk


def _hf_config() -> dict:
    """tokenizer_config.json in the form Qwen3 checkpoints ship (ids filled in by the caller)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | None = None) -> Tokenizer:
    """Train a byte-level BPE on `texts` with `vocab_size` ids in all (special tokens last), and the
    project's Qwen3-format chat template; save it in Hugging Face format to `out_dir` when given.

    Deterministic: the same texts give the same files. Every byte is in the vocabulary, so any text encodes.
    """
    if not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB:
        raise ValueError(f"tokenizer vocab_size must be an int >= {_MIN_VOCAB}, got {vocab_size!r}")
    tk = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tk.train_from_iterator((t for t in texts if isinstance(t, str) and t), trainer=trainer)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    config = _hf_config()
    config["added_tokens_decoder"] = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tk.get_added_tokens_decoder().items())
    }
    tok = Tokenizer(tk, config, QWEN3_CHAT_TEMPLATE)
    if out_dir is not None:
        tok.save(out_dir)
    return tok


def is_tokenizer_dir(path: str) -> bool:
    """True when `path` holds a saved tokenizer (tokenizer.json and tokenizer_config.json)."""
    return os.path.isfile(os.path.join(path, "tokenizer.json")) and os.path.isfile(os.path.join(path, "tokenizer_config.json"))
