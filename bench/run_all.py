"""`make bench`: run every benchmark in bench/ and rewrite the figures table in docs/perf.md.

    .venv/bin/python bench/run_all.py [--only forward,sandbox] [--dry-run] [--perf docs/perf.md]

Each bench runs as its own process with its default arguments (plus the quick arguments below, where a
bench's defaults would take many minutes); its stdout is kept under runs/bench/<name>.log and its
figures are read from the lines it prints (the parsers below: ours, the peer it is measured against,
the ratio, higher = better for ours). Only the table between the `bench-table` markers in docs/perf.md
is rewritten (added after the introduction the first time), with the date and the machine; the prose
stays as it is. A bench that fails or prints no parsable figure gets a row saying so. A bench file
without a parser still runs and gets a row "(no parser: see its log)". models_accel.py needs an
accelerator and is run only where JAX sees one.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- bench-table:start (bench/run_all.py rewrites this table) -->", "<!-- bench-table:end -->"

Row = tuple[str, str, float, str, float, str]  # figure, unit, ours, peer name, peer value, direction ("higher"|"lower")


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
    for label, r, v, t in re.findall(r"(\w+)\s+jax \((\d+) replicas?\)\s+([\d.]+) tok/s.*?\| transformers\s+([\d.]+) tok/s", out):
        rows.append((f"generate {label}, {r} replica(s)", "tok/s", float(v), "transformers generate", float(t), "higher"))
    return rows


def parse_sandbox(out: str) -> list[Row]:
    m = re.search(r"read\s+search_contacts\s+([\d,]+) calls/s", out)
    r = re.search(r"reset \(backup \+ patch\) median ([\d.]+) ms", out)
    rows = []
    if m:
        rows.append(("sandbox read calls/s (one core)", "calls/s", _num(m.group(1)), "target (issue 4)", 20000.0, "higher"))
    if r:
        rows.append(("sandbox reset median", "ms", float(r.group(1)), "target (issue 4)", 2.0, "lower"))
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
    return [("device env episodes/s (real adb server)", "ep/s", float(adb.group(1)), "in-process sandbox", float(sb.group(1)), "higher")] if adb and sb else []


PARSERS: dict[str, Callable[[str], list[Row]]] = {
    "forward": parse_forward, "train_step": parse_train_step, "generate": parse_generate,
    "sandbox": parse_sandbox, "logprobs_memory": parse_logprobs_memory, "rl_step": parse_rl_step, "adb": parse_adb,
}
# Quick arguments where the defaults would take many minutes on a 2-core CPU.
ARGS: dict[str, list[str]] = {"forward": ["--steps", "3"], "generate": ["--repeats", "2"], "sandbox": ["--calls", "20000", "--resets", "1000"]}
NEEDS_ACCELERATOR = {"models_accel"}
SKIP = {"run_all"}


def benches() -> list[str]:
    here = os.path.join(ROOT, "bench")
    return sorted(f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith("_") and f[:-3] not in SKIP)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        cpu = model or cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores, load {os.getloadavg()[0]:.1f}"


def _has_accelerator() -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"], capture_output=True, text=True, timeout=120)
        return out.stdout.strip() not in ("", "cpu")
    except (OSError, subprocess.TimeoutExpired):
        return False


def ratio(ours: float, peer: float, direction: str) -> float:
    """ours relative to the peer, > 1 = ours better (higher-is-better figures: ours/peer; lower: peer/ours)."""
    if ours <= 0 or peer <= 0:
        return float("nan")
    return ours / peer if direction == "higher" else peer / ours


def table(results: dict[str, tuple[str, list[Row]]], date: str, mach: str) -> str:
    lines = [START, "", f"Figures of the last `make bench` ({date}; {mach}). Ratio > 1: ours better.", "",
             "| bench | figure | ours | peer | peer value | ratio | date | machine |", "|---|---|---|---|---|---|---|---|"]
    short = mach.split(",")[0][:40]
    for name, (status, rows) in results.items():
        if not rows:
            lines.append(f"| {name} | {status} | - | - | - | - | {date} | {short} |")
        for fig, unit, ours, peer, pv, direction in rows:
            lines.append(f"| {name} | {fig} | {ours:,.4g} {unit} | {peer} | {pv:,.4g} {unit} | **{ratio(ours, pv, direction):.2f}x** | {date} | {short} |")
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


def run_bench(name: str, log_dir: str, timeout: int) -> tuple[str, list[Row]]:
    cmd = [sys.executable, os.path.join(ROOT, "bench", f"{name}.py"), *ARGS.get(name, [])]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s", []
    out = res.stdout + res.stderr
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f"{name}.log"), "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n" + out)
    print(f"== {name} ({time.perf_counter() - t0:.0f} s, rc {res.returncode})\n{res.stdout[-1500:]}", flush=True)
    if res.returncode != 0:
        return f"failed (rc {res.returncode}; see runs/bench/{name}.log)", []
    if name not in PARSERS:
        return "(no parser: see its log)", []
    rows = PARSERS[name](out)
    return ("ok" if rows else "no figure parsed (see its log)"), rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    ap.add_argument("--perf", default=os.path.join(ROOT, "docs", "perf.md"))
    ap.add_argument("--logs", default=os.path.join(ROOT, "runs", "bench"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per bench")
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not rewrite docs/perf.md")
    args = ap.parse_args(argv)
    names = benches()
    if args.only:
        want = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in want if n not in names]
        if unknown:
            print(f"run_all: unknown bench {unknown[0]!r} (have: {', '.join(names)})", file=sys.stderr)
            return 2
        names = want
    accel = any(n in NEEDS_ACCELERATOR for n in names) and _has_accelerator()
    results: dict[str, tuple[str, list[Row]]] = {}
    for name in names:
        if name in NEEDS_ACCELERATOR and not accel:
            results[name] = ("not run: needs an accelerator", [])
            continue
        results[name] = run_bench(name, args.logs, args.timeout)
    date = datetime.date.today().isoformat()
    block = table(results, date, machine())
    print(block)
    if not args.dry_run:
        rewrite_perf(args.perf, block)
        print(f"rewrote the figures table in {args.perf}")
    failed = [n for n, (s, _) in results.items() if s.startswith(("failed", "timed out"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
