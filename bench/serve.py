"""`mpa serve` under load vs the engine's raw generate throughput, one run.

A `configs/tiny.py`-family model (random weights, its embedding padded past the tokenizer, sampled
under the vocabulary rule), a project-style BPE tokenizer, `mpa serve`'s app on loopback HTTP in this
process. For each concurrency C (default 1, 8, 64) it prints, side by side:

- server: C clients each sending chat requests back to back (`--requests` per client, temperature 0.7,
  `--new` tokens max, distinct seeds) from a **separate load-generator process** (asyncio; `--client
  httpx`: plain HTTP/JSON with keep-alive, the default; `--client openai`: the official AsyncOpenAI
  client), so that the clients' Python does not share this process' GIL; requests/s, completion
  tokens/s, p50 and p99 latency. The load generator still runs on the same cores: its CPU time per
  request is printed under the table.
- raw: the same engine's whole-batch program (`generate_batch`) on batches of C chat prompts with the
  same settings and seeds (what the server could do at best with C requests per call), including the
  chat template, tokenization and detokenization the server does per request: requests/s, tokens/s;
  and `raw slots`: the same batches through the engine's slots (`generate_rows`, no HTTP);
- ratio: server tokens/s over raw tokens/s (target at load: >= 0.9).

Shapes (`--shape`): `deploy` (default) is a decode-bound model, 8 x 512 (mlp 1,536, heads 8/4 x 64,
~30M params), 128 new tokens per request: a decode step's compute is what a request costs, not the
HTTP/JSON around it, as in a real deployment; `toy` is `configs/tiny.py` as it is (2 x 128, 0.9M
params), 16 new tokens, where HTTP and JSON dominate. `--hidden/--layers/...` override either.

`--batcher call slots` (default: both, in one run, against the same raw figures) picks the server's
batching: `call` admits waiting requests into the next whole engine call (`server.batcher`), `slots`
admits them between decode chunks of the engine's slots (`Engine.submit`). `--slot-len` defaults to what
the traffic needs (prompt bucket + `--new`). `--family qwen3_5|qwen3_5_moe` serves a Qwen3.5 hybrid or
MoE model of the same width (DeltaNet layers with attention every 4th) through the same slots.

Usage: `python bench/serve.py [--shape deploy|toy] [--concurrency 1 8 64] [--requests 3] [--new N]
[--replicas 0] [--batcher call slots] [--client httpx|openai] [--chunk 8] [--slot-len L]
[--family qwen3|qwen3_5|qwen3_5_moe] [--hidden H --intermediate I --layers L ...]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

SHAPES = {
    # name: (model overrides, default --new)
    "deploy": ({"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 64}, 128),
    "toy": ({}, 16),
}


def messages(n: int) -> list[list[dict[str, str]]]:
    """The bench's chat requests (the load generator builds the same list)."""
    return [[{"role": "user", "content": f"set an alarm for {i % 12 + 1} am and text mom about request {i}"}] for i in range(n)]


def loadgen(spec: dict) -> dict:
    """The load-generator process: `clients` concurrent clients, a warm-up pass (one request each), then
    the timed pass (`requests` each, back to back). Returns wall time, latencies, tokens, CPU seconds."""
    url, c, per, new, kind = spec["url"], spec["clients"], spec["requests"], spec["new"], spec["client"]
    msgs = messages(c * per)

    async def run() -> dict:
        if kind == "openai":
            import openai

            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)

            async def ask(i: int) -> int:
                r = await client.chat.completions.create(model="mpa", messages=msgs[i], max_tokens=new, temperature=0.7, seed=i)
                assert r.choices and r.choices[0].message.role == "assistant", r
                return r.usage.completion_tokens

            close = client.close
        else:
            import httpx

            client = httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=c, max_keepalive_connections=c))

            async def ask(i: int) -> int:
                resp = await client.post("/v1/chat/completions", json={"model": "mpa", "messages": msgs[i], "max_tokens": new,
                                                                       "temperature": 0.7, "seed": i})
                resp.raise_for_status()
                body = resp.json()
                assert body["choices"][0]["message"]["role"] == "assistant", body
                return int(body["usage"]["completion_tokens"])

            close = client.aclose

        lat: list[float] = []
        toks = 0

        async def worker(w: int, n: int) -> None:
            nonlocal toks
            for k in range(n):
                t = time.perf_counter()
                got = await ask(w * per + k)  # not `toks += await ...`: that reads toks before the await
                lat.append(time.perf_counter() - t)
                toks += got

        try:
            await asyncio.gather(*(worker(w, 1) for w in range(c)))  # warm-up: connections, server-side shapes
            lat.clear()
            toks = 0
            cpu0 = _cpu()
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(w, per) for w in range(c)))
            return {"wall": time.perf_counter() - t0, "lat": lat, "tokens": toks, "cpu_s": _cpu() - cpu0}
        finally:
            await close()

    return asyncio.run(run())


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)  # internal: run as the load-generator process
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="deploy",
                    help="deploy: decode-bound 8 x 512, 128 new tokens (default); toy: configs/tiny.py as it is, 16 new tokens")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--requests", type=int, default=3, help="requests per client (timed pass)")
    ap.add_argument("--new", type=int, default=None, help="max_tokens per request (default: the shape's)")
    ap.add_argument("--vocab", type=int, default=2048, help="tokenizer size (the model's embedding is larger)")
    ap.add_argument("--replicas", type=int, default=0, help="engine weight replicas (0: one per core)")
    ap.add_argument("--batcher", nargs="+", choices=["call", "slots"], default=["call", "slots"])
    ap.add_argument("--client", choices=["httpx", "openai"], default="httpx", help="load generator's HTTP client")
    ap.add_argument("--chunk", type=int, default=8, help="slot loop: decode steps per chunk")
    ap.add_argument("--slot-len", type=int, default=None,
                    help="slot loop: tokens per slot; default prompt bucket + --new")
    ap.add_argument("--family", choices=["qwen3", "qwen3_5", "qwen3_5_moe"], default="qwen3",
                    help="model family (qwen3_5: DeltaNet + gated attention every 4th layer; qwen3_5_moe: + experts)")
    for name in ("hidden", "intermediate", "layers", "heads", "kv-heads", "head-dim"):
        ap.add_argument(f"--{name}", type=int, default=None, help="model shape override")
    args = ap.parse_args(argv)
    if args.loadgen:
        print(json.dumps(loadgen(json.loads(args.loadgen))), flush=True)
        return 0

    import jax

    from mpa_jax import models
    from mpa_jax import tokenizer as tk
    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.engines import engine_replicas
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.server import ServerThread, create_app
    from mpa_jax.rollout.types import SamplingParams

    config = load_config_file(args.config)
    config.rollout.replicas = args.replicas
    overrides, default_new = SHAPES[args.shape]
    new = args.new if args.new is not None else default_new
    for key, value in overrides.items():
        config.model[key] = value
    shape = {"hidden": "hidden_size", "intermediate": "intermediate_size", "layers": "num_hidden_layers",
             "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim"}
    for arg, key in shape.items():
        if getattr(args, arg) is not None:
            config.model[key] = getattr(args, arg)
    tok = tk.build_tokenizer(tk.synthetic_corpus(2000), args.vocab, None)
    cfg = models.config_from_ml(config.model)
    if args.family != "qwen3":
        # The same width and depth as a Qwen3.5 hybrid: DeltaNet heads of the attention's width, every 4th
        # layer gated full attention; MoE: 8 experts (2 per token) of a quarter of the MLP, plus a shared one.
        heads = cfg.num_attention_heads
        cfg = cfg.replace(family=args.family, linear_num_key_heads=max(heads // 2, 1), linear_num_value_heads=heads,
                          linear_key_head_dim=cfg.head_dim, linear_value_head_dim=cfg.head_dim, full_attention_interval=4,
                          partial_rotary_factor=0.25)
        if args.family == "qwen3_5_moe":
            cfg = cfg.replace(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=cfg.intermediate_size // 4,
                              shared_expert_intermediate_size=cfg.intermediate_size // 4, expert_layout="fused")
    if tok.vocab_size > cfg.vocab_size:
        raise SystemExit(f"--vocab {args.vocab} exceeds the model's {cfg.vocab_size} rows")
    params = models.init_params(cfg, jax.random.key(0))
    top = max(args.concurrency)
    engine = Engine(cfg, params, max_batch=top, replicas=engine_replicas(config), vocab_limit=tok.vocab_size)
    im_end = tok.token_id("<|im_end|>")
    msgs = messages(top * args.requests)
    prompts = [tk.generation_prompt_ids(tok, m) for m in msgs]
    slot_len = args.slot_len or max(len(p) for p in prompts) + new
    sp = SamplingParams(max_new_tokens=new, temperature=0.7, stop_token_ids=(im_end,))
    print(f"shape {args.shape}: model {cfg.family} {cfg.num_hidden_layers} x {cfg.hidden_size} (mlp {cfg.intermediate_size}, heads "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} x {cfg.head_dim}), {models.param_count(cfg) / 1e6:.1f}M params, "
          f"vocab {cfg.vocab_size} (tokenizer {tok.vocab_size}), replicas {engine.replicas}, "
          f"prompt ~{int(np.mean([len(p) for p in prompts]))} tokens, max_tokens {new}, temperature 0.7, "
          f"slot_len {slot_len}, chunk {args.chunk}; load generator: separate process, {args.client} client", flush=True)

    # Compile every batch bucket first: under load the server's calls take whatever rows are waiting.
    b = 1
    while b <= top:
        engine.generate_batch(prompts[:b], [sp] * b, list(range(b)))
        b *= 2
    # The slot programs this traffic uses (the server's slot layout), compiled up front as the raw side's.
    engine.configure_slots(slots=top, slot_len=slot_len, chunk=args.chunk)
    for n in sorted({max(len(p) for p in prompts), min(len(p) for p in prompts)}):
        engine.warmup(n, new)
    raw: dict[int, tuple[float, float]] = {}
    raw_slots: dict[int, float] = {}
    for c in args.concurrency:
        batches = [list(range(i, i + c)) for i in range(0, c * args.requests, c)]
        for label, run in (("batch", engine.generate_batch), ("slots", engine.generate_rows)):
            run([prompts[i] for i in batches[0]], [sp] * c, batches[0])  # compile
            t0 = time.perf_counter()
            toks = 0
            for idx in batches:
                # What the server does per request besides decoding: chat template + tokenization, detokenization.
                ids = [tk.generation_prompt_ids(tok, msgs[i]) for i in idx]
                out = run(ids, [sp] * c, idx)
                toks += sum(len(r.token_ids) for r in out)
                _ = [tok.decode(r.token_ids) for r in out]
            dt = time.perf_counter() - t0
            if label == "batch":
                raw[c] = (len(batches) * c / dt, toks / dt)
            else:
                raw_slots[c] = toks / dt

    rows = []
    for kind in args.batcher:
        app = create_app(engine, tok, max_batch=top, batch_wait_s=0.005, default_max_new_tokens=new, batcher=kind,
                         slot_len=slot_len, slot_chunk=args.chunk)
        with ServerThread(app) as server:
            batcher = app.state.get_batcher()
            if batcher.kind != kind:
                raise SystemExit(f"asked for the {kind} batcher, the server runs {batcher.kind}")
            if kind == "slots":  # compile every prefill/chunk width up front, as the raw side did
                for n in sorted({max(len(p) for p in prompts), min(len(p) for p in prompts)}):
                    engine.warmup(n, new)
            for c in args.concurrency:
                spec = {"url": server.url, "clients": c, "requests": args.requests, "new": new, "client": args.client}
                res = subprocess.run([sys.executable, os.path.abspath(__file__), "--loadgen", json.dumps(spec)],
                                     capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
                if res.returncode != 0:
                    raise SystemExit(f"load generator failed ({kind}, {c} clients):\n{res.stderr[-3000:]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                lat, wall = got["lat"], got["wall"]
                rows.append((kind, c, len(lat) / wall, got["tokens"] / wall, float(np.percentile(lat, 50)),
                             float(np.percentile(lat, 99)), 1e3 * got["cpu_s"] / len(lat)))

    print(f"{'batcher':>7} {'clients':>7} {'server req/s':>12} {'server tok/s':>12} {'p50 s':>7} {'p99 s':>7} {'raw req/s':>10} "
          f"{'raw tok/s':>10} {'ratio':>6}")
    for kind, c, rps, tps, p50, p99, _cpu_ms in rows:
        r_rps, r_tps = raw[c]
        print(f"{kind:>7} {c:>7} {rps:>12.2f} {tps:>12.1f} {p50:>7.3f} {p99:>7.3f} {r_rps:>10.2f} {r_tps:>10.1f} {tps / r_tps:>6.2f}")
    print("raw slots (the same batches through Engine.generate_rows, no HTTP): "
          + ", ".join(f"{c} clients {raw_slots[c]:.1f} tok/s ({raw_slots[c] / raw[c][1]:.2f} of raw)" for c in args.concurrency))
    print("load generator CPU per request (same cores): "
          + ", ".join(f"{kind} {c} clients {cpu_ms:.1f} ms" for kind, c, *_, cpu_ms in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
