"""`mpa tokenizer --out DIR [--from-tasks SPLIT]`: build the project's byte-level BPE tokenizer.

The corpus is the project's text (envs tasks and oracle episodes when `mpa_jax.envs` provides them, plus
synthetic chat-formatted tool-call conversations); the vocabulary size is `config.tokenizer.vocab_size`.
"""
from __future__ import annotations

import argparse
import os
import time

import ml_collections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = 'example: mpa tokenizer --out runs/tok'
    parser.add_argument("--out", default=None, help="output directory (default: <workdir>/tokenizer)")
    parser.add_argument("--from-tasks", default=None, metavar="SPLIT",
                        help="train on this task split of mpa_jax.envs too, and fail if envs has none "
                             "(default: the train split when envs provides it, else synthetic text only)")
    parser.add_argument("--max-tasks", type=int, default=None,
                        help="tasks of the split to use (default: config.tokenizer.corpus_tasks)")


def run(args: argparse.Namespace, config: ml_collections.ConfigDict) -> int:
    from rich.console import Console

    from mpa_jax.errors import UserError
    from mpa_jax.tokenizer.build import _MIN_VOCAB
    from mpa_jax.envs.context import ContextFormat
    from mpa_jax.tokenizer.corpus import build_project_tokenizer

    console = Console(stderr=True)
    out = args.out or os.path.join(args.workdir, "tokenizer")
    max_tasks = int(config.tokenizer.corpus_tasks) if args.max_tasks is None else args.max_tasks
    if max_tasks < 0 or (args.from_tasks and max_tasks == 0):
        raise UserError(f"--max-tasks must be >= {1 if args.from_tasks else 0}, got {max_tasks}")
    vocab_size = int(config.tokenizer.vocab_size)
    if vocab_size < _MIN_VOCAB:
        raise UserError(f"config.tokenizer.vocab_size must be >= {_MIN_VOCAB}, got {vocab_size}")
    split = args.from_tasks or str(config.oracle.split)
    t0 = time.perf_counter()
    with console.status(f"building the tokenizer ({vocab_size} ids) from split {split!r} and synthetic text"):
        try:
            tok, meta = build_project_tokenizer(vocab_size, out, split=split, seed=int(config.seed), max_tasks=max_tasks,
                                                require_tasks=bool(args.from_tasks), context=ContextFormat.from_config(config))
        except (ValueError, FileNotFoundError) as e:  # a bad split name or path, as envs reports it
            raise UserError(f"--from-tasks {split!r}: {e}") from None
    console.print(
        f"tokenizer: {meta['tokens']} tokens from {meta['envs_texts']} envs texts and {meta['synthetic_texts']} "
        f"synthetic texts -> {out} ({time.perf_counter() - t0:.1f}s)"
    )
    return 0
