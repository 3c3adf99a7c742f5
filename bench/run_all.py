"""`make bench`: run every benchmark in bench/ and rewrite the figures table in docs/perf.md.

    .venv/bin/python bench/run_all.py [--only forward,sandbox [--merge]] [--dry-run] [--from-logs] [--timeout 600]

Each bench runs as its own process, one at a time, with one XLA host device per usable core and the
`make bench` arguments in ARGS (sizes that finish in ~1-3 minutes on a 2-core host; a bench's own defaults
are its full measurement); its stdout and stderr are kept under runs/bench/<name>.log and its figures are
read from the lines it prints (one parser per bench below: ours, the peer or target it is measured
against, the ratio, > 1 = ours better). Only the table between the `bench-table` markers in docs/perf.md
is rewritten (added before the first section the first time), with the date, the machine (CPU model,
cores) and the load average at the start and end; the prose stays as it is. A bench that exits non-zero,
runs past --timeout or prints no parsable figure gets a row saying it failed, the other rows are still
written, and the exit status is 1. A bench without a parser here can print `BENCH_ROW {json}` lines
(parse_bench_rows); one with neither gets a failed row "no figure parsed".
models_accel.py needs an accelerator and is run only where JAX sees one (elsewhere a row says so).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDERR_MARK = "\n--- stderr ---\n"
START, END = "<!-- bench-table:start (bench/run_all.py rewrites this table) -->", "<!-- bench-table:end -->"

Row = tuple[str, str, float, str, "float | None", str]
"""figure, unit, ours, peer name, peer value (None: no peer, ratio "-"), direction ("higher"|"lower" is better)."""


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def parse_forward(out: str) -> list[Row]:
    ours = re.search(r"mpa_jax \(jit\)\s+fwd\+bwd: ([\d,]+) tokens/s", out)
    rows = []
    for attn, v in re.findall(r"transformers attn=(\w+)\s+fwd\+bwd: ([\d,]+) tokens/s", out):
        if ours:
            rows.append(("fwd+bwd tokens/s", "tok/s", _num(ours.group(1)), f"transformers ({attn})", _num(v), "higher"))
    return rows


def parse_train_step(out: str) -> list[Row]:
    ours = re.search(r"mpa-jax SFT step\s+([\d.]+) tokens/s", out)
    peers = [float(v) for v in re.findall(r"transformers \+ torch AdamW\s+([\d.]+) tokens/s", out)]
    return [("SFT step tokens/s", "tok/s", float(ours.group(1)), "transformers + torch AdamW (best threads)", max(peers), "higher")] if ours and peers else []


def parse_generate(out: str) -> list[Row]:
    rows = []
    # labels are "greedy" and "sampled T=1" (padded to 12 columns)
    for label, r, v, t in re.findall(r"^(\S.*?)\s+jax \((\d+) replicas?\)\s+([\d.]+) tok/s.*?\| transformers\s+([\d.]+) tok/s", out, re.M):
        rows.append((f"generate {label}, {r} replica(s)", "tok/s", float(v), "transformers generate (best threads)", float(t), "higher"))
    return rows


def parse_sandbox(out: str) -> list[Row]:
    g = re.search(r"read\s+get_contact\s+([\d,]+) calls/s", out)
    r = re.search(r"reset \(backup \+ patch\) median ([\d.]+) ms", out)
    st = re.search(r"simulated \(10 ms backend\)\s+serial\s+([\d,]+) steps/s\s+pooled \(threads\)\s+([\d,]+) steps/s", out)
    rows = []
    if g:
        rows.append(("sandbox read calls/s (get_contact)", "calls/s", _num(g.group(1)), "target (issue 4)", 20000.0, "higher"))
    if r:
        rows.append(("sandbox reset median", "ms", float(r.group(1)), "target (issue 4)", 2.0, "lower"))
    if st:
        rows.append(("simulated env (10 ms replies) steps/s, pooled", "steps/s", _num(st.group(2)), "serial stepping", _num(st.group(1)), "higher"))
    return rows


def parse_logprobs_memory(out: str) -> list[Row]:
    rows = []
    for v, naive, chunked in re.findall(r"V=([\d,]+): naive temp ([\d.]+) GiB.*?chunked temp ([\d.]+) GiB", out):
        rows.append((f"log-prob peak temp, V={v}", "GiB", float(chunked), "naive full logits", float(naive), "lower"))
    return rows


def parse_rl_step(out: str) -> list[Row]:
    ours = re.search(r"^ours: .*?total_s ([\d.]+)", out, re.M)
    trl = re.search(r"^trl GRPOTrainer: .*?total_s ([\d.]+)", out, re.M)
    return [("RL iteration (rollouts + update)", "s", float(ours.group(1)), "TRL GRPOTrainer", float(trl.group(1)), "lower")] if ours and trl else []


def parse_adb(out: str) -> list[Row]:
    adb = re.search(r"adb device env: .*?= ([\d.]+) episodes/s", out)
    sb = re.search(r"sandbox \(in process\): ([\d.]+) episodes/s", out)
    echo = re.search(r"adb shell echo round trip: median ([\d.]+) ms", out)
    rows = [("device env episodes/s (real adb server)", "ep/s", float(adb.group(1)), "in-process sandbox", float(sb.group(1)), "higher")] if adb and sb else []
    if echo:
        rows.append(("adb shell echo round trip, median", "ms", float(echo.group(1)), "-", None, "lower"))
    return rows


def parse_context_tokens(out: str) -> list[Row]:
    m = re.search(r"^(\w+)/(\w+): (\d+) episodes, mean (\d+) tokens \(max (\d+)\), mean (\d+) trained on", out, re.M)
    return [(f"tokens per oracle episode ({m.group(1)}/{m.group(2)}, {m.group(3)} episodes)", "tokens", float(m.group(4)), "-", None, "lower")] if m else []


def _json_objects(out: str) -> list[dict]:
    """Every JSON object a bench printed starting at a line start (possibly indented over several lines)."""
    found = []
    for m in re.finditer(r"^\{", out, re.M):
        try:
            obj = json.JSONDecoder().raw_decode(out[m.start():])[0]
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def parse_memory(out: str) -> list[Row]:
    objs = [o for o in _json_objects(out) if "ingest_s" in o and "tokens" in o]
    if not objs:
        return []
    d = objs[-1]
    tokens = float(d["tokens"])
    # target (docs/memory.md): 10M tokens ingested in under 120 s on the 2-core box, search p50 under 20 ms
    rows = [(f"memory ingest tokens/s ({tokens / 1e6:.1f}M tokens)", "tok/s", tokens / max(d["ingest_s"], 1e-3),
             "target (10M in 120 s)", 1e7 / 120, "higher")]
    for key, label in (("search_questions", "suite questions"), ("search_random_turns", "random turns")):
        if key in d:
            rows.append((f"memory search p50 ({label})", "ms", float(d[key]["p50_ms"]), "target", 20.0, "lower"))
    return rows


def parse_scan_compile(out: str) -> list[Row]:
    tot: dict[tuple[str, int], float] = {}
    for layout, depth, total in re.findall(r"^\| (scanned|unrolled) \| (\d+) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", out, re.M):
        tot[(layout, int(depth))] = float(total)
    depths = sorted({d for _, d in tot})
    rows = []
    for d in depths:
        if ("scanned", d) in tot and ("unrolled", d) in tot:
            rows.append((f"fwd+bwd compile, {d} layers", "s", tot[("scanned", d)], "unrolled layers", tot[("unrolled", d)], "lower"))
    if len(depths) >= 2 and ("scanned", depths[0]) in tot and ("scanned", depths[-1]) in tot:
        grow = tot[("scanned", depths[-1])] / tot[("scanned", depths[0])]
        rows.append((f"scanned compile, {depths[-1]} vs {depths[0]} layers", "x", grow, "target", 1.5, "lower"))
    return rows


def parse_serve(out: str) -> list[Row]:
    rows = []
    # one row per (batcher, clients); older outputs had no batcher column
    line = r"^\s*(call|slots)?\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$"
    if "server tok/s" not in out:
        return rows
    for kind, c, _rps, tps, p50, _p99, _rrps, rtps, _ratio in re.findall(line, out.split("server tok/s", 1)[1], re.M):
        batcher = f"{kind} batcher, " if kind else ""
        rows.append((f"serve tok/s, {batcher}{c} clients (p50 {float(p50):.2f} s)", "tok/s", float(tps), "raw engine generate_rows", float(rtps), "higher"))
    return rows


def parse_rollout_engine(out: str) -> list[Row]:
    """One row per mode of the table after the header line (`mode slots episodes/s ...`); every mode after the
    first (`batch`: the round-synchronous whole-batch path) is compared with it."""
    if "episodes/s    tok/s" not in out:
        return []
    line = r"^\s*(\w+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+\d+\s+(\d+)/(\d+)\s+\d+\s*$"
    found = re.findall(line, out.split("episodes/s    tok/s", 1)[1], re.M)
    rows: list[Row] = []
    base = (found[0][0], float(found[0][2])) if found else None
    for mode, slots, eps, _tps, _wall, same, n in found:
        slot = "" if slots == "-" else f", {slots} slots"
        peer, pv = (f"{base[0]} (same run)", base[1]) if base and mode != base[0] else ("-", None)
        rows.append((f"rollout episodes/s, {mode}{slot} (same tokens {same}/{n})", "episodes/s", float(eps), peer, pv, "higher"))
    return rows


def parse_learning_sweep(out: str) -> list[Row]:
    """The sweep's data-parallel table (what `make bench` runs: the grid cells are experiments for
    docs/learning.md, not figures): the starter's SFT step on D host devices vs on the round's first count."""
    rows = []
    first = {}
    for d, rnd, ms in re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| \d+ \| [\d,]+ \| [\d.]+x \|$", out, re.M):
        if rnd not in first:
            first[rnd] = (d, float(ms))
        elif d != first[rnd][0]:
            rows.append((f"starter SFT step, {d} host devices (data-parallel), round {rnd}", "ms", float(ms),
                         f"{first[rnd][0]} host device(s)", first[rnd][1], "lower"))
    return rows


def parse_rl_memory(out: str) -> list[Row]:
    """The budgeted RL update's analysed micro-batch size and the process' peak RSS after one update."""
    rows = []
    m = re.search(r"XLA analysis of one micro-batch: ([\d.]+) GiB", out)
    if m:
        rows.append(("RL update, XLA analysis of one micro-batch", "GiB", float(m.group(1)), "-", None, "lower"))
    m = re.search(r"peak RSS before the update [\d.]+ GiB, after ([\d.]+) GiB", out)
    if m:
        rows.append(("RL update, process peak RSS", "GiB", float(m.group(1)), "-", None, "lower"))
    return rows


def parse_tool_retrieval(out: str) -> list[Row]:
    rows = []
    m = re.search(r"recall@(\d+)\s+([\d.]+)\s+<- target >= ([\d.]+)", out)
    if m:
        rows.append((f"tool recall@{m.group(1)}", "", float(m.group(2)), "target", float(m.group(3)), "higher"))
    lat = re.search(r"latency per query: mean [\d.]+ ms, p50 ([\d.]+) ms", out)
    if lat:
        rows.append(("tool retrieval latency p50", "ms", float(lat.group(1)), "-", None, "lower"))
    return rows


def parse_models_accel(out: str) -> list[Row]:
    """Parity (our bfloat16 logits' error vs transformers' own, against a float32 reference) and fwd+bwd tokens/s."""
    rows = []
    parity = r"^parity (\S+)\s+vs the float32 reference: ours bf16 ([\d.e+-]+), transformers bf16 \((\w+)\) ([\d.e+-]+)"
    for name, ours, dev, theirs in re.findall(parity, out, re.M):
        rows.append((f"bf16 logits error vs float32, {name}", "", float(ours), f"transformers bf16 ({dev})", float(theirs), "lower"))
    step = r"^fwd\+bwd (.+?) attention=(\w+) batch \d+ x \d+: [\d.]+ ms/step.*?, ([\d,]+) tokens/s, [\d.]+ model TFLOP/s, MFU ([\d.]+%|n/a)"
    for dev, attn, tok, mfu in re.findall(step, out, re.M):
        rows.append((f"fwd+bwd tokens/s on {dev} ({attn}; MFU {mfu})", "tok/s", _num(tok), "-", None, "higher"))
    return rows


def parse_bench_rows(out: str) -> list[Row]:
    """Machine-readable rows any bench may print, one a line, besides (or instead of) a parser here:
    `BENCH_ROW {"figure": "...", "unit": "s", "ours": 1.0, "peer": "...", "peer_value": 2.0, "direction": "lower"}`
    (peer and peer_value may be omitted or null: no ratio)."""
    rows = []
    for line in re.findall(r"^BENCH_ROW (\{.*\})\s*$", out, re.M):
        d = json.loads(line)
        pv = d.get("peer_value")
        rows.append((str(d["figure"]), str(d.get("unit", "")), float(d["ours"]), str(d.get("peer") or "-"),
                     None if pv is None else float(pv), "lower" if d.get("direction") == "lower" else "higher"))
    return rows


PARSERS: dict[str, Callable[[str], list[Row]]] = {
    "adb": parse_adb, "context_tokens": parse_context_tokens, "forward": parse_forward, "generate": parse_generate,
    "logprobs_memory": parse_logprobs_memory, "memory": parse_memory, "models_accel": parse_models_accel,
    "learning_sweep": parse_learning_sweep, "rl_memory": parse_rl_memory, "rl_step": parse_rl_step, "sandbox": parse_sandbox, "scan_compile": parse_scan_compile, "serve": parse_serve,
    "tool_retrieval": parse_tool_retrieval, "train_step": parse_train_step, "fleet": parse_bench_rows,
    "rollout_engine": parse_rollout_engine, "rl_engine_step": parse_bench_rows, "engine_reuse": parse_bench_rows,
}
# `make bench` sizes: each bench's arguments finish in ~1-3 minutes on a 2-core host (docs/perf.md lists them);
# the benches' own defaults are the full measurements and take much longer there.
ARGS: dict[str, list[str]] = {
    "adb": ["--episodes", "30", "--echoes", "100"],
    "fleet": ["--requests", "16", "--new", "32", "--repeats", "2", "--warmup", "2", "--latency-requests", "20"],
    "forward": ["--steps", "2", "--rounds", "2", "--batch", "4"],
    "generate": ["--repeats", "1", "--new", "32"],
    "memory": ["--tokens", "1m", "--queries", "100", "--dir", "/tmp/mpa_memory_bench_1m"],
    "learning_sweep": ["--out", "/tmp/mpa_learning_sweep_bench", "--dp", "1", "2", "--dp-steps", "2", "--dp-repeats", "1"],
    "rl_memory": ["--config", "configs/tiny.py", "--layout", "budget", "--episodes", "16", "--min-len", "300", "--max-len", "900"],
    "rollout_engine": ["--episodes", "16", "--slots", "16"],
    "engine_reuse": ["--episodes", "4", "--slots", "4", "--tasks", "1", "--group", "2", "--mix", "40"],
    "rl_engine_step": ["--steps", "2", "--tasks", "4", "--group", "4"],
    "rl_step": ["--prompt-len", "64", "--completion-len", "16", "--tasks", "4", "--group", "4", "--iters", "1"],
    "sandbox": ["--calls", "20000", "--resets", "1000", "--live", "32", "--rounds", "20"],
    "serve": ["--concurrency", "1", "16", "--requests", "2", "--new", "16"],
    "train_step": ["--steps", "3", "--seq-len", "256"],
}
NEEDS_ACCELERATOR = {"models_accel"}
# sglang_cpu needs SGLang in its own venv (docs/scaling.md); fuzz_episodes is a robustness check (it asserts, its
# figures are counts, not speeds; tests/unit/test_fuzz_episodes.py runs it small); world_shift is a success figure
# of a checkpoint (docs/experiments.md); rl_lift_gpu is an experiment for a lent GPU (its figures go to docs/perf.md by hand; tests/integration/test_benches.py dry-runs it):
# external_replay replays the external benchmarks' ground truth (counts, not speeds; tests/unit/test_bfcl.py and
# test_agentdojo.py run it small); bfcl_route needs BFCL with its dependencies in its own venv (docs/benchmark.md):
# engine_gpu is the engine at
# Qwen3-1.7B shape on a lent GPU: all are run by hand
SKIP = {"run_all", "sglang_cpu", "fuzz_episodes", "world_shift", "rl_lift_gpu", "external_replay",
        "bfcl_route", "engine_gpu"}


def benches() -> list[str]:
    here = os.path.join(ROOT, "bench")
    return sorted(f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith("_") and f[:-3] not in SKIP)


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine() -> str:
    """CPU model (from /proc/cpuinfo) and usable cores."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        cpu = model or cpu
    except OSError:
        pass
    return f"{cpu}, {cores()} cores"


def _has_accelerator() -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"], capture_output=True, text=True, timeout=120)
        return out.stdout.strip() not in ("", "cpu")
    except (OSError, subprocess.TimeoutExpired):
        return False


def ratio(ours: float, peer: float | None, direction: str) -> float | None:
    """ours relative to the peer, > 1 = ours better (higher-is-better figures: ours/peer; lower: peer/ours);
    None when there is no peer figure."""
    if peer is None:
        return None
    if ours <= 0 or peer <= 0:
        return float("nan")
    return ours / peer if direction == "higher" else peer / ours


def _fmt(v: float, unit: str) -> str:
    # thousands as plain digits with separators (4 significant digits would print 1.587e+05)
    return (f"{v:,.0f} {unit}" if abs(v) >= 1000 else f"{v:.4g} {unit}").strip()


def table(results: dict[str, tuple[str, list[Row]]], date: str, mach: str, load: str = "") -> str:
    """The markdown block between the markers: one row per figure, one row per bench without figures."""
    lines = [START, "", f"Figures of the last `make bench` ({date}; {mach}" + (f"; {load}" if load else "")
             + "). Ratio > 1: ours better (ours/peer for higher-is-better figures, peer/ours for lower).", "",
             "| bench | figure | ours | peer | peer value | ratio | date | machine |", "|---|---|---|---|---|---|---|---|"]
    short = mach.split(",")[0].replace("|", "/")[:40] + "".join(f",{p}" for p in mach.split(",")[1:2])
    for name, (status, rows) in results.items():
        if not rows:
            lines.append(f"| {name} | {status} | - | - | - | - | {date} | {short} |")
        for fig, unit, ours, peer, pv, direction in rows:
            r = ratio(ours, pv, direction)
            rs = "-" if r is None else f"**{r:.2f}x**"
            pvs = "-" if pv is None else _fmt(pv, unit)
            lines.append(f"| {name} | {fig} | {_fmt(ours, unit)} | {peer} | {pvs} | {rs} | {date} | {short} |")
    lines += ["", END]
    return "\n".join(lines)


def rewrite_perf(perf_path: str, block: str) -> None:
    """Replace the marked table in `perf_path` (or insert it before the first `## ` section); prose kept."""
    text = open(perf_path, encoding="utf-8").read() if os.path.exists(perf_path) else "# Performance figures\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        text = head + block + tail
    else:
        i = text.find("\n## ")
        text = (text + "\n" + block + "\n") if i < 0 else text[: i + 1] + "## Figures table\n\n" + block + "\n\n" + text[i + 1:]
    with open(perf_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(perf_path + ".tmp", perf_path)


def merge_table(perf_path: str, block: str, note: str) -> str:
    """`block` (a table of the benches just run) merged into the table already in `perf_path` (`--merge`):
    the re-run benches' rows replace theirs, every other bench's rows are kept as they were, and `note`
    (which benches were re-run, when, under what load) is added under the old heading line."""
    text = open(perf_path, encoding="utf-8").read() if os.path.exists(perf_path) else ""
    if START not in text or END not in text:
        return block
    old = text.split(START, 1)[1].split(END, 1)[0].strip("\n").splitlines()
    new = block.split(START, 1)[1].split(END, 1)[0].strip("\n").splitlines()

    def rows_by_bench(lines: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line in lines:
            if line.startswith("| ") and not line.startswith(("| bench |", "|---")):
                out.setdefault(line.split(" | ", 1)[0][2:], []).append(line)
        return out

    old_rows, new_rows = rows_by_bench(old), rows_by_bench(new)
    merged = {**old_rows, **new_rows}
    head = [line for line in old if not line.startswith("|")]
    head = [h for h in head if h.strip()]
    lines = [START, "", *[h for h in head], "", note, "",
             "| bench | figure | ours | peer | peer value | ratio | date | machine |", "|---|---|---|---|---|---|---|---|"]
    for name in sorted(merged):
        lines += merged[name]
    return "\n".join([*lines, "", END])


def keep_heading(perf_path: str, block: str) -> str:
    """`block`'s rows under the heading lines (everything but the table) of the table already in `perf_path`."""
    text = open(perf_path, encoding="utf-8").read() if os.path.exists(perf_path) else ""
    if START not in text or END not in text:
        return block
    old = text.split(START, 1)[1].split(END, 1)[0].strip("\n").splitlines()
    head = [line for line in old if not line.startswith("|")]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return "\n".join([START, "", *head, "", *rows, "", END]).replace("\n\n\n", "\n\n")


def bench_env() -> dict[str, str]:
    """The benches' environment: one XLA host device per usable core (the Makefile's 8 is for tests)."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={cores()}"])
    return env


def run_bench(name: str, log_dir: str, timeout: int) -> tuple[str, list[Row]]:
    """Run bench/<name>.py with its `make bench` arguments; (status, rows). Never raises for a bench's failure."""
    cmd = [sys.executable, os.path.join(ROOT, "bench", f"{name}.py"), *ARGS.get(name, [])]
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, f"{name}.log")
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=bench_env())
    except subprocess.TimeoutExpired as e:
        with open(log, "w", encoding="utf-8") as f:
            f.write(" ".join(cmd) + "\n" + _text(e.stdout) + _text(e.stderr))
        print(f"== {name}: timed out after {timeout} s", flush=True)
        return f"failed: timed out after {timeout} s (log: {os.path.relpath(log, ROOT)})", []
    dt = time.perf_counter() - t0
    with open(log, "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n" + res.stdout + STDERR_MARK + res.stderr)
    print(f"== {name} ({dt:.0f} s, rc {res.returncode})\n{res.stdout[-1500:]}", flush=True)
    where = os.path.relpath(log, ROOT)
    if res.returncode != 0:
        return f"failed (rc {res.returncode}; log: {where})", []
    try:
        rows = (PARSERS[name](res.stdout) if name in PARSERS else []) + parse_bench_rows(res.stdout)
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:  # a changed output format is a failure, not a crash
        return f"failed: parser error {type(e).__name__}: {e} (log: {where})", []
    return (f"ok ({dt:.0f} s)" if rows else f"failed: no figure parsed (log: {where})"), rows


def from_log(name: str, log_dir: str) -> tuple[str, list[Row]]:
    """(status, rows) re-read from the log of an earlier run (`--from-logs`): the same run's figures, parsed again."""
    log = os.path.join(log_dir, f"{name}.log")
    if not os.path.exists(log):
        return f"failed: no log {os.path.relpath(log, ROOT)}", []
    text = open(log, encoding="utf-8").read().split("\n", 1)[-1]
    stdout = text.split(STDERR_MARK, 1)[0]
    try:
        rows = (PARSERS[name](stdout) if name in PARSERS else []) + parse_bench_rows(stdout)
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        return f"failed: parser error {type(e).__name__}: {e} (log: {os.path.relpath(log, ROOT)})", []
    return ("ok (from its log)" if rows else f"failed: no figure parsed (log: {os.path.relpath(log, ROOT)})"), rows


def _text(b: "bytes | str | None") -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    ap.add_argument("--perf", default=os.path.join(ROOT, "docs", "perf.md"))
    ap.add_argument("--logs", default=os.path.join(ROOT, "runs", "bench"))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per bench (a bench past it is a failed row)")
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not rewrite docs/perf.md")
    ap.add_argument("--merge", action="store_true",
                    help="with --only: replace only these benches' rows in the existing table, keep the others")
    ap.add_argument("--from-logs", action="store_true", help="parse the logs of the last run again instead of running")
    args = ap.parse_args(argv)
    names = benches()
    if args.only:
        want = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in want if n not in names]
        if unknown:
            print(f"run_all: unknown bench {unknown[0]!r} (have: {', '.join(names)})", file=sys.stderr)
            return 2
        names = want
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    accel = any(n in NEEDS_ACCELERATOR for n in names) and _has_accelerator()
    results: dict[str, tuple[str, list[Row]]] = {}
    for name in names:
        if name in NEEDS_ACCELERATOR and not accel:
            results[name] = ("not run: needs an accelerator (JAX sees only the CPU)", [])
            continue
        results[name] = from_log(name, args.logs) if args.from_logs else run_bench(name, args.logs, args.timeout)
    load1 = os.getloadavg()
    load = (f"load average {load0[0]:.1f} (1 min) / {load0[1]:.1f} (5 min) at start, {load1[0]:.1f} at the end; "
            f"{(time.perf_counter() - t0) / 60:.0f} min in all")
    block = table(results, stamp.split()[0], machine() + f", started {stamp}", load)
    if args.from_logs:  # the logs are an earlier run's: keep the heading (date, machine, load) it wrote
        block = keep_heading(args.perf, block)
    if args.merge:
        args_used = "; ".join(f"{n} {' '.join(ARGS.get(n, [])) or '(defaults)'}" for n in results)
        block = merge_table(args.perf, block, f"Re-run on their own ({stamp}; {load}): {args_used}.")
    print(block)
    if not args.dry_run:
        rewrite_perf(args.perf, block)
        print(f"rewrote the figures table in {args.perf}")
    failed = [n for n, (s, _) in results.items() if s.startswith("failed")]
    if failed:
        print(f"run_all: {len(failed)} bench(es) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
