"""Load on `mpa serve`'s guard: 64 concurrent clients on loopback mixing valid, malformed, oversized
(declared and chunked), unauthenticated, wrong-model and over-long requests.

Every valid request is answered with its own reply, every bad one gets its 4xx (a 429 is retried, as
clients do, and counted), and the server process's RSS stays bounded while 64 MB bodies are declared and
1 MiB chunked bodies are pushed at it (sampled with psutil; figures printed).

The server runs in its own process (so its memory is its own) with a `ScriptedEngine` model (a test double
that replies `ok <tag>` to the request tagged `<tag>`, so correctness is exact); HTTP, the guard, parsing,
rendering and the batcher are the real ones.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "load-key"
CLIENTS = 64
ROUNDS = 2  # each client sends every kind this many times

SERVER = r"""
import re, sys, time
from mpa_jax import tokenizer as tk
from mpa_jax.rollout.server import Limits, create_app, serve_forever
from mpa_jax.rollout.testing import ScriptedEngine

tok = tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)

def reply(ids, _i):
    time.sleep(0.02)  # a model's decode time, so that requests overlap (the reply does not depend on it)
    tags = re.findall(r"req (\d+) (\d+)", tok.decode(ids))
    return "ok %s %s" % tags[-1] if tags else "no tag"

limits = Limits(max_body_bytes=256 * 1024, max_prompt_chars=20000, max_prompt_tokens=4096,
                max_concurrent_requests=16, max_queued_requests=16)
app = create_app(ScriptedEngine(tok, reply), tok, served_model_name="mpa", api_key=sys.argv[1], limits=limits,
                 max_batch=16)
serve_forever(app, "127.0.0.1", 0, on_start=lambda url: print("URL " + url, flush=True))
"""


def _start() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, KEY], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("URL "):
            # Keep reading the server's log: a full pipe would block the server's event loop.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split()[1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("the server did not start")


async def _raw(port: int, head: bytes, parts: list[bytes]) -> int:
    """Status of a hand-written request: headers, then body parts, written while the answer is read (the
    server may answer before the body is all sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def write() -> None:
        try:
            writer.write(head)
            for part in parts:
                writer.write(part)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the server answered and closed

    sender = asyncio.create_task(write())
    try:
        line = await reader.readline()
        return int(line.split()[1])
    finally:
        sender.cancel()
        writer.close()


def test_64_clients_mixing_good_and_bad_requests(capsys):
    proc, url = _start()
    port = int(url.rsplit(":", 1)[1])
    ps = psutil.Process(proc.pid)
    rss = {"start": ps.memory_info().rss, "peak": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss["peak"] = max(rss["peak"], ps.memory_info().rss)
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    auth = {"Authorization": f"Bearer {KEY}"}
    big_head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 67108864\r\n\r\n")
    chunk_head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                  + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"y" * 32768
    chunked = [b"%x\r\n" % len(piece) + piece + b"\r\n"] * 32 + [b"0\r\n\r\n"]  # 1 MiB
    counts: dict[str, int] = {}
    wrong: list[str] = []

    async def client(c: httpx.AsyncClient, i: int) -> None:
        async def send(kind: str, expect: int, call) -> None:
            while True:  # 429: retry, as clients do
                status, body = await call()
                if status != 429:
                    break
                counts["429 retried"] = counts.get("429 retried", 0) + 1
                await asyncio.sleep(0.05)
            counts[kind] = counts.get(kind, 0) + 1
            if status != expect:
                wrong.append(f"{kind}: {status} {body[:200]}")
            elif kind == "valid" and body != want:
                wrong.append(f"valid: {body[:200]} != {want}")

        async def post(payload, headers=auth, raw: bytes | None = None):
            r = await c.post("/v1/chat/completions", headers={**headers, "content-type": "application/json"},
                             content=raw if raw is not None else json.dumps(payload))
            if r.status_code == 200:
                return 200, r.json()["choices"][0]["message"]["content"]
            err = r.json()["error"]
            return r.status_code, f"{err['code']} {err['message']}"

        async def raw_status(head, parts):
            return await _raw(port, head, parts), ""

        for j in range(ROUNDS):
            tag = f"req {i} {j}"
            want = f"ok {i} {j}"
            good = {"model": "mpa", "messages": [{"role": "user", "content": tag}], "max_tokens": 8}
            kinds = [
                ("valid", 200, lambda: post(good)),
                ("malformed json", 400, lambda: post(None, raw=b'{"messages": [')),
                ("bad field", 400, lambda: post({**good, "temperature": 9})),
                ("declared 64 MB", 413, lambda: raw_status(big_head, [])),
                ("chunked 1 MiB", 413, lambda: raw_status(chunk_head, chunked)),
                ("no api key", 401, lambda: post(good, headers={})),
                ("wrong model", 404, lambda: post({**good, "model": "gpt-4o"})),
                ("prompt too long", 400, lambda: post({**good, "messages": [{"role": "user", "content": "z" * 30000}]})),
            ]
            k = (i + j) % len(kinds)
            for kind, expect, call in kinds[k:] + kinds[:k]:  # clients start on different kinds
                await send(kind, expect, call)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=CLIENTS)) as c:
            await asyncio.gather(*(client(c, i) for i in range(CLIENTS)))

    try:
        sampler.start()
        t0 = time.perf_counter()
        asyncio.run(run())
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        health = httpx.get(url + "/health").status_code
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
    start_mb, peak_mb = rss["start"] / 2**20, rss["peak"] / 2**20
    with capsys.disabled():
        print(f"\nload: {CLIENTS} clients, {sum(v for k, v in counts.items() if k != '429 retried')} requests in {wall:.1f} s;"
              f" {json.dumps(counts)}; server RSS {start_mb:.0f} MB at start, peak {peak_mb:.0f} MB")
    assert not wrong, wrong[:10]
    assert all(counts[k] == CLIENTS * ROUNDS for k in counts if k != "429 retried"), counts
    assert health == 200
    # Bounded memory: 64 MB bodies are declared 128 times and 1 MiB is pushed 128 times, but nothing
    # beyond max_body_bytes (256 KiB) per running request is ever held.
    assert peak_mb - start_mb < 150, (start_mb, peak_mb)
