"""`make bench` (bench/run_all.py): runs a bench for real, parses its figures, rewrites only the marked
table of docs/perf.md and keeps the prose."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("run_all", os.path.join(ROOT, "bench", "run_all.py"))
run_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_all)


def test_parsers_read_the_benches_lines():
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


def test_run_all_rewrites_only_the_table(tmp_path, monkeypatch):
    monkeypatch.setitem(run_all.ARGS, "sandbox", ["--calls", "2000", "--resets", "200"])  # small: the real run is `make bench`
    perf = tmp_path / "perf.md"
    perf.write_text("# Performance figures\n\nIntro prose.\n\n## Models\n\nModel prose stays.\n")
    assert run_all.main(["--only", "sandbox", "--perf", str(perf), "--logs", str(tmp_path / "logs")]) == 0
    text = perf.read_text()
    assert "Intro prose." in text and "Model prose stays." in text
    assert text.index(run_all.START) < text.index("## Models")
    rows = [line for line in text.splitlines() if line.startswith("| sandbox |")]
    assert len(rows) == 2 and all("x** |" in r for r in rows)
    assert (tmp_path / "logs" / "sandbox.log").exists()
    # a second rewrite replaces the table instead of adding one
    run_all.rewrite_perf(str(perf), run_all.table({"forward": ("ok", [("fwd+bwd tokens/s", "tok/s", 2.0, "torch", 1.0, "higher")])},
                                                  "2026-12-01", "cpu, 2 cores"))
    text = perf.read_text()
    assert text.count(run_all.START) == 1 and "Model prose stays." in text and "Intro prose." in text
    assert "| sandbox |" not in text and "| forward | fwd+bwd tokens/s | 2 tok/s | torch | 1 tok/s | **2.00x** |" in text
    assert run_all.main(["--only", "nonesuch", "--perf", str(perf)]) == 2
