"""SFT data: packing fields, determinism, per-process shards, resumable position, clear errors."""
import json

import numpy as np
import pytest

from mpa_jax.envs.contract import Trajectory, write_jsonl
from mpa_jax.sft import data as sft_data
from mpa_jax.sft.synthetic import make_trajectories, write_trajectories


def _ex(tokens, mask):
    return sft_data.Example(np.asarray(tokens, np.int32), np.asarray(mask, np.int32))


def test_pack_row_fields():
    row = sft_data.pack_row([_ex([5, 6, 7], [0, 1, 1]), _ex([8, 9], [0, 1])], 8)
    assert row["input_ids"].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert row["targets"].tolist() == [6, 7, 0, 9, 0, 0, 0, 0]  # next token of the same example only
    assert row["loss_weights"].tolist() == [1, 1, 0, 1, 0, 0, 0, 0]  # mask of the target token
    assert row["segment_ids"].tolist() == [1, 1, 1, 2, 2, 0, 0, 0]
    assert row["positions"].tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    with pytest.raises(ValueError):
        sft_data.pack_row([_ex([1] * 5, [1] * 5), _ex([1] * 4, [1] * 4)], 8)


def test_examples_truncate_and_drop_without_loss_tokens():
    t = Trajectory("a", tokens=list(range(10)), loss_mask=[0] * 5 + [1] * 5, logprobs=[0.0] * 10, steps=[])
    ex, truncated = sft_data.example_from_trajectory(t, 6)
    assert truncated and ex.tokens.tolist() == [0, 1, 2, 3, 4, 5]
    ex, _ = sft_data.example_from_trajectory(t, 5)  # only prompt tokens survive
    assert ex is None


def _load(path, rows, local, **kw):
    return sft_data.load_sft_data(path, seq_len=64, num_rows=rows, local_rows=local, seed=kw.pop("seed", 0), **kw)


def test_batches_are_deterministic_and_independent_of_the_process_split(tmp_path):
    path = write_trajectories(str(tmp_path / "d.jsonl"), 60, 256, seed=1)
    whole = _load(path, 4, range(4))
    a, b = _load(path, 4, [0, 1]), _load(path, 4, [2, 3])  # two "processes"
    again = _load(path, 4, range(4))
    for _ in range(12):  # crosses epochs
        w, g = whole.train.next_local(), again.train.next_local()
        parts = {**a.train.next_local(), **b.train.next_local()}
        assert sorted(parts) == sorted(w) == [0, 1, 2, 3]
        for r in w:
            for k in sft_data.FIELDS:
                assert np.array_equal(w[r][k], parts[r][k]) and np.array_equal(w[r][k], g[r][k])
    # a different seed shuffles differently
    other = _load(path, 4, range(4), seed=9).train.next_local()
    first = _load(path, 4, range(4)).train.next_local()
    assert any(not np.array_equal(first[r]["input_ids"], other[r]["input_ids"]) for r in range(4))


def test_a_process_parses_only_its_own_lines(tmp_path):
    path = str(tmp_path / "d.jsonl")
    trajs = make_trajectories(20, 256, seed=2)
    lines = [t.to_json() for t in trajs]
    train, _ = sft_data.split_lines(len(lines), 4, 0, 0.0)
    # corrupt every line that belongs to row 3's stream: rows 0-2 still load, row 3 fails naming the line
    bad = set(train[3])
    with open(path, "w") as f:
        for i, line in enumerate(lines):
            f.write(("{not json" if i in bad else line) + "\n")
    data = _load(path, 4, [0, 1, 2])
    assert sorted(data.train.streams) == [0, 1, 2]
    with pytest.raises(sft_data.DataError, match=rf"line {min(bad) + 1} is not a valid Trajectory"):
        _load(path, 4, [3])


def test_position_restores_the_exact_continuation(tmp_path):
    path = write_trajectories(str(tmp_path / "d.jsonl"), 40, 256, seed=3)
    run = _load(path, 2, range(2))
    for _ in range(7):
        run.train.next_local()
    saved = run.train.positions()
    expected = [run.train.next_local() for _ in range(6)]
    fresh = _load(path, 2, range(2))
    fresh.train.set_positions(saved)
    for want in expected:
        got = fresh.train.next_local()
        for r in want:
            assert np.array_equal(want[r]["input_ids"], got[r]["input_ids"])
    with pytest.raises(sft_data.DataError, match="position"):
        fresh.train.set_positions({0: (0, 10_000), 1: (0, 0)})


def test_every_example_appears_once_per_epoch(tmp_path):
    path = write_trajectories(str(tmp_path / "d.jsonl"), 30, 256, seed=4)
    data = _load(path, 2, range(2))
    stream = data.train.streams[0]
    seen = []
    while stream.epoch == 0:
        row = stream.next_row()
        seen.append(int(row["segment_ids"].max()))
    assert sum(seen) == len(stream.examples)


def test_held_out_split_is_disjoint_and_fixed(tmp_path):
    path = write_trajectories(str(tmp_path / "d.jsonl"), 50, 256, seed=5)
    train, evals = sft_data.split_lines(50, 4, 0, 0.2)
    tr = {i for s in train for i in s}
    ev = {i for s in evals for i in s}
    assert not tr & ev and len(ev) == 10 and len(tr | ev) == 50
    data = _load(path, 4, range(4), eval_fraction=0.2)
    b1, b2 = data.eval_batches(2), data.eval_batches(2)
    assert data.has_eval
    for x, y in zip(b1, b2):
        for r in x:
            assert np.array_equal(x[r]["input_ids"], y[r]["input_ids"])


def test_bad_data_gets_one_clear_error(tmp_path):
    with pytest.raises(sft_data.DataError, match="not found"):
        _load(str(tmp_path / "missing.jsonl"), 2, range(2))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(sft_data.DataError, match="no trajectories"):
        _load(str(empty), 2, range(2))
    small = write_trajectories(str(tmp_path / "s.jsonl"), 3, 256)
    with pytest.raises(sft_data.DataError, match="fewer than the 4 rows"):
        _load(small, 4, range(4))
    wrong = tmp_path / "w.jsonl"
    wrong.write_text(json.dumps({"task_id": "x", "tokens": [1, 2], "loss_mask": [1], "logprobs": [0.0, 0.0], "steps": []}) + "\n")
    with pytest.raises(sft_data.DataError, match="line 1 .*same length"):
        _load(str(wrong), 1, range(1))


def test_infra_failures_and_failed_episodes_are_dropped(tmp_path):
    trajs = make_trajectories(6, 256, seed=6)
    from mpa_jax.envs.contract import Verification

    trajs[0].infra_failure = True
    for t in trajs[1:3]:
        t.verification = Verification(success=True, score=1.0)
    trajs[3].verification = Verification(success=False, score=0.0)
    path = str(tmp_path / "d.jsonl")
    write_jsonl(path, trajs)
    data = _load(path, 1, [0], only_success=True)
    assert data.stats.dropped_infra == 1
    assert data.stats.dropped_failed == 3  # one failed, two without a verification
    assert len(data.train.streams[0].examples) == 2


def test_parquet_reads_the_same_rows_or_names_the_missing_dependency(tmp_path):
    trajs = make_trajectories(8, 256, seed=7)
    path = str(tmp_path / "d.parquet")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        open(path, "wb").write(b"PAR1")
        with pytest.raises(sft_data.DataError, match="needs pyarrow"):
            _load(path, 2, range(2))
        return
    rows = [t.to_dict() for t in trajs]
    for r in rows:
        for key in ("steps", "verification", "costs", "provenance", "messages"):
            r[key] = json.dumps(r[key])
    pq.write_table(pa.Table.from_pylist(rows), path)
    jsonl = str(tmp_path / "d.jsonl")
    write_jsonl(jsonl, trajs)
    a, b = _load(path, 2, range(2)).train.next_local(), _load(jsonl, 2, range(2)).train.next_local()
    for r in a:
        assert np.array_equal(a[r]["input_ids"], b[r]["input_ids"])
