"""`mpa serve` under load vs the engine's raw generate throughput, one run.

The `configs/tiny.py` model (random weights, its embedding padded past the tokenizer, sampled under
the vocabulary rule), a project-style BPE tokenizer, `mpa serve`'s app on loopback HTTP. For each
concurrency C (default 1, 8, 64) it prints, side by side:

- server: C clients (the official `openai` AsyncOpenAI client) each sending chat requests back to
  back (`--requests` per client, temperature 0.7, `--new` tokens max, distinct seeds); requests/s,
  completion tokens/s, p50 and p99 latency;
- raw: the same engine's `generate_rows` on batches of C chat prompts with the same settings and
  seeds (what the server could do at best with C requests per call): requests/s, tokens/s;
- ratio: server tokens/s over raw tokens/s (target at load: >= 0.8).

`--batcher call slots` (default: both, in one run, against the same raw figures) picks the server's
batching: `call` admits waiting requests into the next whole engine call (`server.batcher`), `slots`
admits them between decode chunks of the slot loop (`rollout.slots`). `--hidden/--layers/...` change
the model's shape (e.g. `--hidden 256 --intermediate 768 --layers 4 --heads 8 --kv-heads 4`, the
starter's) so that decode, not HTTP, dominates a request.

Usage: `python bench/serve.py [--concurrency 1 8 64] [--requests 4] [--new 32] [--replicas 0]
[--batcher call slots] [--chunk 8] [--slot-len 128] [--hidden H --intermediate I --layers L ...]`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--new", type=int, default=32, help="max_tokens per request")
    ap.add_argument("--vocab", type=int, default=2048, help="tokenizer size (the model's embedding is larger)")
    ap.add_argument("--replicas", type=int, default=0, help="engine weight replicas (0: one per core)")
    ap.add_argument("--batcher", nargs="+", choices=["call", "slots"], default=["call", "slots"])
    ap.add_argument("--chunk", type=int, default=8, help="slot loop: decode steps per chunk")
    ap.add_argument("--slot-len", type=int, default=128, help="slot loop: tokens per slot (attention reads all of them every step)")
    for name in ("hidden", "intermediate", "layers", "heads", "kv-heads", "head-dim"):
        ap.add_argument(f"--{name}", type=int, default=None, help="model shape override")
    args = ap.parse_args(argv)

    import jax
    import openai

    from mpa_jax import models
    from mpa_jax import tokenizer as tk
    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.jax_engine import JaxEngine
    from mpa_jax.rollout.run import engine_replicas
    from mpa_jax.rollout.server import ServerThread, create_app
    from mpa_jax.rollout.types import SamplingParams

    config = load_config_file(args.config)
    config.rollout.replicas = args.replicas
    shape = {"hidden": "hidden_size", "intermediate": "intermediate_size", "layers": "num_hidden_layers",
             "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim"}
    for arg, key in shape.items():
        if getattr(args, arg) is not None:
            config.model[key] = getattr(args, arg)
    tok = tk.build_tokenizer(tk.synthetic_corpus(2000), args.vocab, None)
    cfg = models.config_from_ml(config.model)
    if tok.vocab_size > cfg.vocab_size:
        raise SystemExit(f"--vocab {args.vocab} exceeds the model's {cfg.vocab_size} rows")
    params = models.init_params(cfg, jax.random.key(0))
    top = max(args.concurrency)
    engine = JaxEngine(cfg, params, max_batch=top, replicas=engine_replicas(config), vocab_limit=tok.vocab_size)
    im_end = tok.token_id("<|im_end|>")
    messages = [[{"role": "user", "content": f"set an alarm for {i % 12 + 1} am and text mom about request {i}"}]
                for i in range(top * args.requests)]
    prompts = [tk.generation_prompt_ids(tok, m) for m in messages]
    sp = SamplingParams(max_new_tokens=args.new, temperature=0.7, stop_token_ids=(im_end,))
    print(f"model {cfg.family} {cfg.num_hidden_layers} x {cfg.hidden_size} (mlp {cfg.intermediate_size}, heads "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} x {cfg.head_dim}), {models.param_count(cfg) / 1e6:.1f}M params, "
          f"vocab {cfg.vocab_size} (tokenizer {tok.vocab_size}), replicas {engine.replicas}, "
          f"prompt ~{int(np.mean([len(p) for p in prompts]))} tokens, max_tokens {args.new}, temperature 0.7", flush=True)

    # Compile every batch bucket first: under load the server's calls take whatever rows are waiting.
    b = 1
    while b <= top:
        engine.generate_rows(prompts[:b], [sp] * b, list(range(b)))
        b *= 2
    raw: dict[int, tuple[float, float]] = {}
    for c in args.concurrency:
        batches = [list(range(i, i + c)) for i in range(0, c * args.requests, c)]
        engine.generate_rows([prompts[i] for i in batches[0]], [sp] * c, batches[0])  # compile
        t0 = time.perf_counter()
        toks = 0
        for idx in batches:
            out = engine.generate_rows([prompts[i] for i in idx], [sp] * c, idx)
            toks += sum(len(r.token_ids) for r in out)
        dt = time.perf_counter() - t0
        raw[c] = (len(batches) * c / dt, toks / dt)

    rows = []
    for kind in args.batcher:
        app = create_app(engine, tok, max_batch=top, batch_wait_s=0.005, default_max_new_tokens=args.new, batcher=kind,
                         slot_len=args.slot_len, slot_chunk=args.chunk)
        with ServerThread(app) as server:

            async def load(c: int) -> tuple[float, list[float], int]:
                client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
                lat: list[float] = []
                toks = 0

                async def worker(w: int) -> None:
                    nonlocal toks
                    for k in range(args.requests):
                        i = w * args.requests + k
                        t = time.perf_counter()
                        r = await client.chat.completions.create(model="mpa", messages=messages[i], max_tokens=args.new,
                                                                 temperature=0.7, seed=i)
                        lat.append(time.perf_counter() - t)
                        toks += r.usage.completion_tokens

                try:
                    t0 = time.perf_counter()
                    await asyncio.gather(*(worker(w) for w in range(c)))
                    return time.perf_counter() - t0, lat, toks
                finally:
                    await client.close()

            batcher = app.state.get_batcher()
            if batcher.kind != kind:
                raise SystemExit(f"asked for the {kind} batcher, the server runs {batcher.kind}")
            if kind == "slots":  # compile every prefill/chunk width up front, as the raw side did
                for n in sorted({len(p) for p in prompts}, key=lambda n: -n)[:1] + [min(len(p) for p in prompts)]:
                    batcher.decoder.warmup(n)
            for c in args.concurrency:
                asyncio.run(load(c))  # warm: compiles the shapes this load produces
                wall, lat, toks = asyncio.run(load(c))
                n = len(lat)
                rows.append((kind, c, n / wall, toks / wall, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))))

    print(f"{'batcher':>7} {'clients':>7} {'server req/s':>12} {'server tok/s':>12} {'p50 s':>7} {'p99 s':>7} {'raw req/s':>10} "
          f"{'raw tok/s':>10} {'ratio':>6}")
    for kind, c, rps, tps, p50, p99 in rows:
        r_rps, r_tps = raw[c]
        print(f"{kind:>7} {c:>7} {rps:>12.2f} {tps:>12.1f} {p50:>7.3f} {p99:>7.3f} {r_rps:>10.2f} {r_tps:>10.1f} {tps / r_tps:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
