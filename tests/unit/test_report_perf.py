"""`make bench` (bench/run_all.py): every bench has a parser that reads its recorded output, a bench runs
for real and its figures land in the marked table of docs/perf.md with the prose kept, and a bench that
fails (non-zero exit, time-out, no parsable figure) yields a failed row and a non-zero exit without losing
the rows of the benches that worked.

The recorded outputs under tests/data/bench_<name>.txt are real runs' stdout (the first line is the
command that produced it), captured by `make bench` on the 2-core dev box (models_accel: its CPU dry run).
"""
import importlib.util
import math
import os
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
spec = importlib.util.spec_from_file_location("run_all", os.path.join(ROOT, "bench", "run_all.py"))
run_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_all)


def _sample(name: str) -> str:
    with open(os.path.join(DATA, f"bench_{name}.txt"), encoding="utf-8") as f:
        return f.read().split("\n", 1)[1].split(run_all.STDERR_MARK, 1)[0]


# Figures each recorded output must yield (a substring of the figure's name), so a parser that silently
# drops a row fails here.
EXPECTED = {
    "adb": ["device env episodes/s", "echo round trip"],
    "context_tokens": ["tokens per oracle episode"],
    "forward": ["fwd+bwd tokens/s"],
    "generate": ["generate greedy", "generate sampled T=1"],
    "learning_sweep": ["2 host devices (data-parallel)"],
    "logprobs_memory": ["V=151,936", "V=248,320"],
    "memory": ["memory ingest", "memory search p50 (suite questions)", "memory search p50 (random turns)"],
    "models_accel": ["bf16 logits error vs float32, gqa2_untied", "fwd+bwd tokens/s on cpu"],
    "rl_memory": ["micro-batch", "peak RSS"],
    "rl_step": ["RL iteration"],
    "rl_engine_step": ["RL step wall time", "RL step rollout time"],
    "rollout_engine": ["rollout episodes/s, batch", "rollout episodes/s, continuous, 32 slots"],
    "sandbox": ["read calls/s", "reset median", "simulated env"],
    "scan_compile": ["compile, 64 layers", "64 vs 8 layers"],
    "serve": ["1 clients", "16 clients"],
    "tool_retrieval": ["tool recall@8", "latency p50"],
    "train_step": ["SFT step tokens/s"],
    "engine_reuse": ["evaluation episodes/s", "evaluation prefill per prompt-side token", "RL groups prefill per prompt-side token",
                     "compiles, 200-prompt mix"],
    "fleet": ["2 workers via router", "1 worker via router", "latency via router"],
}


@pytest.mark.parametrize("name", run_all.benches())
def test_every_bench_has_a_parser_that_reads_its_recorded_output(name):
    assert name in run_all.PARSERS, f"bench/{name}.py has no parser in bench/run_all.py"
    rows = run_all.PARSERS[name](_sample(name))
    figures = [r[0] for r in rows]
    for want in EXPECTED[name]:
        assert any(want in f for f in figures), (want, figures)
    for fig, unit, ours, peer, pv, direction in rows:
        assert math.isfinite(ours) and ours > 0 and direction in ("higher", "lower"), (fig, ours)
        assert pv is None or (math.isfinite(pv) and pv > 0), (fig, pv)
        r = run_all.ratio(ours, pv, direction)
        assert (r is None) == (pv is None) and (r is None or r > 0)
    block = run_all.table({name: ("ok", rows)}, "2026-12-01", "cpu, 2 cores")
    assert sum(line.startswith(f"| {name} |") for line in block.splitlines()) == len(rows)


def test_parsers_read_the_benches_lines_exactly():
    fwd = ("mpa_jax (jit)           fwd+bwd: 6,000 tokens/s (682 ms/step)\n"
           "transformers attn=eager fwd+bwd: 5,000 tokens/s (707 ms/step)   ratio ours/torch: 1.20x\n")
    (row,) = run_all.parse_forward(fwd)
    assert row[2] == 6000 and row[4] == 5000 and run_all.ratio(row[2], row[4], row[5]) == 1.2
    mem = "V=151,936: naive temp 10.46 GiB (total 11.65); chunked temp 1.28 GiB (total 2.47); temp ratio 8.1x"
    (row,) = run_all.parse_logprobs_memory(mem)
    assert round(run_all.ratio(row[2], row[4], row[5]), 1) == 8.2  # lower is better: peer / ours
    assert run_all.parse_train_step("nothing here") == []
    (row,) = run_all.parse_rl_step("ours: rollout_s 1.000  total_s 2.000\ntrl GRPOTrainer: total_s 5.000\n")
    assert run_all.ratio(row[2], row[4], row[5]) == 2.5
    gen = ("greedy       jax (2 replicas)      900 tok/s (  10.0 ms; first call incl. compile  1.00 s) | transformers      300 tok/s (  30.0 ms) | ratio  3.00x\n"
           "sampled T=1  jax (1 replica)      450 tok/s (  20.0 ms; first call incl. compile  1.00 s) | transformers      300 tok/s (  30.0 ms) | ratio  1.50x\n")
    assert [(r[0], r[2], r[4]) for r in run_all.parse_generate(gen)] == [
        ("generate greedy, 2 replica(s)", 900, 300), ("generate sampled T=1, 1 replica(s)", 450, 300)]
    # memory prints an indented JSON object; the parser takes the last one with the ingest figures
    rows = run_all.parse_memory('log {"x": 1}\n{\n "tokens": 2000000,\n "ingest_s": 10.0,\n "search_questions": {"p50_ms": 4.0}\n}\n')
    assert [(r[0], r[2]) for r in rows] == [("memory ingest tokens/s (2.0M tokens)", 200000.0), ("memory search p50 (suite questions)", 4.0)]
    assert run_all.ratio(rows[1][2], rows[1][4], rows[1][5]) == 5.0


def _fake_benches(tmp_path, monkeypatch):
    """A bench/ folder of real scripts: one that works, one that exits 3, one that prints nothing parsable,
    one that hangs past the time-out."""
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "good.py").write_text("print('ours 4.0 vs peer 2.0')\n")
    (bench / "broken.py").write_text("import sys\nprint('half a line')\nsys.exit(3)\n")
    (bench / "mute.py").write_text("print('no figures today')\n")
    (bench / "slow.py").write_text("import time\ntime.sleep(30)\n")
    monkeypatch.setattr(run_all, "ROOT", str(tmp_path))

    def parse(out):
        import re
        m = re.search(r"ours ([\d.]+) vs peer ([\d.]+)", out)
        return [("widgets/s", "w/s", float(m.group(1)), "peer", float(m.group(2)), "higher")] if m else []

    for name in ("good", "broken", "mute", "slow"):
        monkeypatch.setitem(run_all.PARSERS, name, parse)


def test_a_failing_bench_gives_a_failed_row_and_a_nonzero_exit(tmp_path, monkeypatch):
    _fake_benches(tmp_path, monkeypatch)
    perf = tmp_path / "perf.md"
    perf.write_text("# Performance figures\n\nIntro prose.\n\n## Models\n\nModel prose stays.\n")
    rc = run_all.main(["--perf", str(perf), "--logs", str(tmp_path / "logs"), "--timeout", "5"])
    assert rc == 1
    text = perf.read_text()
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| bench")}
    assert "**2.00x**" in rows["good"] and "4 w/s" in rows["good"]
    assert "failed (rc 3" in rows["broken"]
    assert "failed: no figure parsed" in rows["mute"]
    assert "failed: timed out after 5 s" in rows["slow"]
    assert "Intro prose." in text and "Model prose stays." in text
    assert (tmp_path / "logs" / "broken.log").read_text().startswith(sys.executable)
    # the same run's logs parse again into the same rows
    assert run_all.main(["--only", "good", "--from-logs", "--perf", str(perf), "--logs", str(tmp_path / "logs")]) == 0
    assert "**2.00x**" in perf.read_text() and "| broken |" not in perf.read_text()


def test_run_all_rewrites_only_the_table(tmp_path, monkeypatch):
    # small: the real run is `make bench`
    monkeypatch.setitem(run_all.ARGS, "sandbox", ["--calls", "2000", "--resets", "200", "--live", "8", "--rounds", "10"])
    perf = tmp_path / "perf.md"
    prose = textwrap.dedent("""\
        # Performance figures

        Intro prose.

        ## Models

        Model prose stays.
        """)
    perf.write_text(prose)
    assert run_all.main(["--only", "sandbox", "--perf", str(perf), "--logs", str(tmp_path / "logs")]) == 0
    text = perf.read_text()
    assert "Intro prose." in text and "Model prose stays." in text
    assert text.index(run_all.START) < text.index("## Models")
    rows = [line for line in text.splitlines() if line.startswith("| sandbox |")]
    assert len(rows) == 3 and all("x** |" in r for r in rows), rows
    assert "cores" in text and "load average" in text
    assert (tmp_path / "logs" / "sandbox.log").exists()
    # a second rewrite replaces the table instead of adding one; everything outside the markers is unchanged
    before, after = text.split(run_all.START)[0], text.split(run_all.END)[1]
    run_all.rewrite_perf(str(perf), run_all.table({"forward": ("ok", [("fwd+bwd tokens/s", "tok/s", 2.0, "torch", 1.0, "higher")])},
                                                  "2026-12-01", "cpu, 2 cores"))
    text = perf.read_text()
    assert text.count(run_all.START) == 1 and text.split(run_all.START)[0] == before and text.split(run_all.END)[1] == after
    assert "| sandbox |" not in text and "| forward | fwd+bwd tokens/s | 2 tok/s | torch | 1 tok/s | **2.00x** |" in text
    assert run_all.main(["--only", "nonesuch", "--perf", str(perf)]) == 2


def test_merge_replaces_only_the_rerun_benches_rows(tmp_path, monkeypatch):
    _fake_benches(tmp_path, monkeypatch)
    perf = tmp_path / "perf.md"
    perf.write_text("# Perf\n\nProse.\n\n## Section\n\nMore prose.\n")
    run_all.rewrite_perf(str(perf), run_all.table({"broken": ("failed (rc 3)", []), "mute": ("ok", [("m", "s", 1.0, "p", 3.0, "lower")])},
                                                  "2026-12-01", "cpu, 2 cores", "load 9"))
    assert run_all.main(["--only", "good", "--merge", "--perf", str(perf), "--logs", str(tmp_path / "logs")]) == 0
    text = perf.read_text()
    assert "| broken | failed (rc 3) |" in text and "| mute | m | 1 s | p | 3 s | **3.00x** |" in text
    assert "| good | widgets/s | 4 w/s | peer | 2 w/s | **2.00x** |" in text and "Re-run on their own" in text
    assert "load 9" in text and "Prose." in text and "More prose." in text and text.count(run_all.START) == 1


def test_a_bench_without_a_parser_can_print_bench_rows(tmp_path, monkeypatch):
    _fake_benches(tmp_path, monkeypatch)
    (tmp_path / "bench" / "rowful.py").write_text(
        "import json\nprint('BENCH_ROW ' + json.dumps({'figure': 'sweep s', 'unit': 's', 'ours': 3.0, 'peer': 'old', "
        "'peer_value': 6.0, 'direction': 'lower'}))\nprint('BENCH_ROW ' + json.dumps({'figure': 'success', 'ours': 0.5}))\n")
    perf = tmp_path / "perf.md"
    assert run_all.main(["--only", "rowful", "--perf", str(perf), "--logs", str(tmp_path / "logs")]) == 0
    text = perf.read_text()
    assert "| rowful | sweep s | 3 s | old | 6 s | **2.00x** |" in text and "| rowful | success | 0.5 | - | - | - |" in text
    with pytest.raises(ValueError):
        run_all.parse_bench_rows('BENCH_ROW {"figure": "x"}\n'.replace('"x"}', '"x", "ours": "many"}'))
