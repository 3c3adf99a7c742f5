"""Rollout throughput past one server: 1 vs 2 `mpa serve` workers behind the real sglang-router, and the
router's cost per request against a direct connection, side by side in one run.

    .venv/bin/python bench/fleet.py [--requests 32] [--new 64] [--repeats 3] [--latency-requests 30]
                                    [--hidden 512 --layers 4 --intermediate 1536] [--batcher call] [--policy round_robin]

Each worker is an `mpa serve` process pinned to its own core (`taskset -c 0` / `-c 1`, one XLA host
device, one engine replica, `serve.max_batch` = all requests). The client is `SGLangEngine`, as the RL
trainer uses it: one request per prompt, all in flight at once, sampling with `for_ratios` settings and
no stop tokens (every request generates exactly `--new` tokens). Throughput: completion tokens per
second of wall time over a batch of `--requests` prompts (median of `--repeats`, after a warm-up batch
that compiles every shape), for one worker direct, one worker behind the router, two workers
behind the router, and two workers balanced by the client itself (`rollout.sglang_workers`, no router). Router cost: `--latency-requests` sequential one-token requests, direct vs through
the router (median and p90 of each, and the difference). The router and this client share the machine's
cores with the workers (on a 2-core host there is nothing else to give them), so "2 workers" is also
"2 workers + router + client on 2 cores". Prints the figures and `BENCH_ROW` lines for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, path: str, proc: subprocess.Popen, log: str, timeout_s: float = 300.0, ok=None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited ({proc.returncode}):\n{open(log).read()[-3000:]}")
        try:
            r = httpx.get(url + path, timeout=5)
            if r.status_code == 200 and (ok is None or ok(r.json())):
                return
        except (httpx.TransportError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}{path} not ready after {timeout_s:.0f}s; see {log}")
        time.sleep(0.3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=32, help="prompts per timed batch (all in flight at once)")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches per path first (compilation)")
    ap.add_argument("--latency-requests", type=int, default=30, help="sequential one-token requests per path")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--batcher", default="call", choices=("call", "slots"),
                    help="the workers' serve.batcher: the slot loop compiles a prefill per admission size and a chunk"
                         " per slot count, which arrival timing decides, so its timings jump with compilations; whole"
                         " engine calls keep the shapes fixed")
    ap.add_argument("--slot-len", type=int, default=256, help="serve.slot_len of the workers")
    ap.add_argument("--policy", default="round_robin", help="sglang-router --policy")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    for name in ("requests", "new", "repeats", "latency_requests"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    import httpx

    from mpa_jax import tokenizer as tk
    from mpa_jax.rollout.sglang import SGLangEngine
    from mpa_jax.rollout.testing import tiny_checkpoint
    from mpa_jax.rollout.types import SamplingParams

    cores = sorted(os.sched_getaffinity(0))
    pin = shutil.which("taskset") is not None and len(cores) >= 2
    work = args.workdir or tempfile.mkdtemp(prefix="mpa_fleet_bench_")
    tok = tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)
    ckpt = tiny_checkpoint(os.path.join(work, "ckpt"), vocab_size=tok.vocab_size, seed=0, hidden_size=args.hidden,
                           num_hidden_layers=args.layers, intermediate_size=args.intermediate,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4)
    tok.save(ckpt)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONUNBUFFERED="1")
    procs: list[tuple[subprocess.Popen, str]] = []

    def start(cmd: list[str], log: str, core: int | None = None) -> subprocess.Popen:
        if core is not None and pin:
            cmd = ["taskset", "-c", str(core)] + cmd
        p = subprocess.Popen(cmd, cwd=work, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        procs.append((p, log))
        return p

    try:
        workers = []
        for i in range(2):
            port, log = _free_port(), os.path.join(work, f"worker{i}.log")
            p = start([sys.executable, "-m", "mpa_jax.cli", "serve", "--config", os.path.join(ROOT, "configs", "tiny.py"),
                       "--workdir", os.path.join(work, f"w{i}"), "--checkpoint", ckpt, "--port", str(port),
                       "--config.rollout.replicas=1", f"--config.serve.max_batch={args.requests}",
                       f"--config.rollout.batch_size={args.requests}", f"--config.serve.batcher={args.batcher}",
                       f"--config.serve.slot_len={args.slot_len}"], log, core=cores[i % len(cores)])
            workers.append((f"http://127.0.0.1:{port}", p, log))
        for url, p, log in workers:
            _wait(url, "/health", p, log)
        routers = {}
        for n in (1, 2):
            port, log = _free_port(), os.path.join(work, f"router{n}.log")
            p = start([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[w[0] for w in workers[:n]],
                       "--host", "127.0.0.1", "--port", str(port), "--policy", args.policy, "--log-level", "warn",
                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())], log)
            url = f"http://127.0.0.1:{port}"
            _wait(url, "/workers", p, log, ok=lambda d, n=n: len(d.get("workers", [])) == n)
            routers[n] = url

        prompts = [tok.encode(f"rollout prompt {i}: set an alarm for seven and text mom that I am late") for i in range(args.requests)]
        sp = SamplingParams.for_ratios(max_new_tokens=args.new, temperature=1.0)
        paths = {"1 worker, direct": SGLangEngine(workers[0][0], max_concurrency=args.requests),
                 "1 worker, router": SGLangEngine(routers[1], max_concurrency=args.requests),
                 "2 workers, router": SGLangEngine(routers[2], max_concurrency=args.requests),
                 "2 workers, client": SGLangEngine(workers=[w[0] for w in workers], max_concurrency=args.requests)}
        # Warm-up: the slot loop compiles a prefill per admission size and a decode chunk per slot count,
        # and which sizes occur depends on arrival timing, so a few batches per path before timing.
        for client in paths.values():
            for w in range(args.warmup):
                client.generate(prompts, sp, seeds=[w * 100 + i for i in range(args.requests)])
        tps: dict[str, float] = {}
        for name, client in paths.items():
            runs = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                out = client.generate(prompts, sp, seeds=[1000 * (r + 1) + i for i in range(args.requests)])
                wall = time.perf_counter() - t0
                if any(o.finish_reason == "abort" for o in out):
                    raise SystemExit(f"{name}: a request failed: {next(o.error for o in out if o.finish_reason == 'abort')}")
                runs.append(sum(len(o.token_ids) for o in out) / wall)
            tps[name] = statistics.median(runs)
            print(f"  {name}: " + ", ".join(f"{x:.0f}" for x in runs) + " tok/s", flush=True)

        lat: dict[str, list[float]] = {}
        for name, url in (("direct", workers[0][0]), ("router", routers[1])):
            with httpx.Client(timeout=60) as c:
                body = {"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}, "return_logprob": True}
                c.post(url + "/generate", json=body)  # warm the connection
                xs = []
                for _ in range(args.latency_requests):
                    t0 = time.perf_counter()
                    r = c.post(url + "/generate", json=body)
                    xs.append((time.perf_counter() - t0) * 1000)
                    if r.status_code != 200:
                        raise SystemExit(f"{name}: HTTP {r.status_code}: {r.text[:200]}")
            lat[name] = sorted(xs)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def p90(xs: list[float]) -> float:
        return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]

    load = os.getloadavg()
    print(f"fleet bench: {args.requests} requests x {args.new} new tokens, model hidden {args.hidden} x {args.layers} layers, batcher {args.batcher},"
          f" policy {args.policy}, workers pinned {'to cores ' + ','.join(map(str, cores[:2])) if pin else 'no (taskset or 2 cores missing)'},"
          f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, v in tps.items():
        print(f"  rollout tokens/s  {name:<18} {v:9.1f}")
    # "2 workers, client": no router, this client balances over the worker list (rollout.sglang_workers).
    print(f"  2 workers / 1 worker (both via router): {tps['2 workers, router'] / tps['1 worker, router']:.2f}x;"
          f" router / direct (1 worker): {tps['1 worker, router'] / tps['1 worker, direct']:.2f}x")
    md, mr = statistics.median(lat["direct"]), statistics.median(lat["router"])
    print(f"  one-token request latency: direct median {md:.2f} ms (p90 {p90(lat['direct']):.2f}),"
          f" via router median {mr:.2f} ms (p90 {p90(lat['router']):.2f}); router overhead {mr - md:+.2f} ms per request")
    print(f"  2 workers, client-balanced / 1 worker direct: {tps['2 workers, client'] / tps['1 worker, direct']:.2f}x")
    rows = [
        {"figure": "fleet rollout tokens/s, 2 workers via router", "unit": "tok/s", "ours": round(tps["2 workers, router"], 1),
         "peer": "1 worker via router", "peer_value": round(tps["1 worker, router"], 1), "direction": "higher"},
        {"figure": "fleet rollout tokens/s, 1 worker via router", "unit": "tok/s", "ours": round(tps["1 worker, router"], 1),
         "peer": "1 worker direct", "peer_value": round(tps["1 worker, direct"], 1), "direction": "higher"},
        {"figure": "fleet one-token request latency via router", "unit": "ms", "ours": round(mr, 2),
         "peer": "direct", "peer_value": round(md, 2), "direction": "lower"},
    ]
    for row in rows:
        print("BENCH_ROW " + json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
