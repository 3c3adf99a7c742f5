"""`mpa rl` / `mpa experiment` user errors, and the experiment's summary, table and plot."""
from __future__ import annotations

import os

import pytest

from mpa_jax import cli
from mpa_jax.experiments import care_vs_vanilla as experiment


def test_bad_rl_config_values_are_one_line_errors(tmp_path, capsys):
    rc = cli.main(["rl", "--workdir", str(tmp_path / "r"), "--config.rl.algo=ppo"])
    err = capsys.readouterr().err
    assert rc == 2 and "config.rl.algo" in err and len(err.strip().splitlines()) == 1
    rc = cli.main(["rl", "--workdir", str(tmp_path / "r"), "--config.rl.templates=no.such_template"])
    err = capsys.readouterr().err
    assert rc == 2 and "no.such_template" in err
    rc = cli.main(["rl", "--workdir", str(tmp_path / "r"), "--init", str(tmp_path / "missing")])  # the old spelling
    err = capsys.readouterr().err
    assert rc == 2 and f"no checkpoint at {tmp_path / 'missing'}" in err and len(err.strip().splitlines()) == 1
    rc = cli.main(["experiment", "nope", "--workdir", str(tmp_path / "e")])
    assert rc == 2 and "unknown experiment" in capsys.readouterr().err
    # an experiment names its start as every command does (--init: the old spelling), resolved before anything runs
    rc = cli.main(["experiment", "rl-lift", "--workdir", str(tmp_path / "e"), "--init", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--checkpoint: no checkpoint at {tmp_path / 'missing'}" in err and len(err.strip().splitlines()) == 1
    rc = cli.main(["experiment", "rl-lift", "--workdir", str(tmp_path / "e")])
    assert rc == 2 and "rl-lift needs --checkpoint" in capsys.readouterr().err


def test_experiment_summary_table_and_plot(tmp_path):
    def recs(succ, toks):
        return [{"step": i + 1, "rl/success": s, "rl/output_tokens": t, "rl/tool_calls": 1.0, "rl/lambda": 0.1, "rl/competence": 0.5}
                for i, (s, t) in enumerate(zip(succ, toks))]

    runs = {"care": {0: recs([0.2, 0.4, 0.6, 0.8], [50, 40, 30, 20]), 1: recs([0.2, 0.4, 0.6, 0.6], [50, 40, 30, 30])},
            "vanilla": {0: recs([0.2, 0.4, 0.6, 0.8], [50, 50, 50, 50]), 1: recs([0.2, 0.2, 0.6, 0.8], [50, 50, 50, 60])}}
    s = experiment.summarise(runs)
    assert s["algos"]["care"]["success_final"] == pytest.approx(0.7)
    assert s["algos"]["care"]["output_tokens_final"] == pytest.approx(25.0)
    assert s["algos"]["vanilla"]["output_tokens_last3"] == pytest.approx((50 + 50 + 50 + 50 + 50 + 60) / 6)
    t = experiment.table(s)
    assert "| care | 0.200 | 0.700 |" in t and "| vanilla |" in t
    png = experiment.plot(runs, str(tmp_path / "p.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000
