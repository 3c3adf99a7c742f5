"""MetricsWriter: TensorBoard has every step metrics.jsonl has, at every moment (a SIGKILL keeps both),
and a resumed run's rewritten steps appear once in both. TensorBoard's own reader (EventAccumulator,
with its purge of orphaned steps) is the reference for what a user sees."""
import json
import os

from mpa_jax.train.metrics import MetricsWriter, read_metrics, scalar_leaves, truncate_metrics


def _tb_scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def _jsonl(path, tag):
    return [(r["step"], r[tag]) for r in read_metrics(path) if tag in r]


def test_tensorboard_is_on_disk_when_write_returns(tmp_path):
    """No close (as after SIGKILL): TensorBoard already has every step the JSONL has."""
    w = MetricsWriter(str(tmp_path), enabled=True)
    for step in range(1, 21):
        w.write(step, {"loss": 1.0 / step, "skip": None}, prefix="train/")
    tb = _tb_scalars(str(tmp_path / "tb"), "train/loss")
    assert [s for s, _ in tb] == list(range(1, 21))
    assert [s for s, _ in tb] == [s for s, _ in _jsonl(w.path, "train/loss")]
    w.close()


def test_resume_drops_the_steps_after_the_checkpoint_in_both(tmp_path):
    """Run 1 logs steps 1-20 and is killed; its checkpoint is step 10; run 2 resumes there and logs
    11-25 (other values). Both logs show 1-10 from run 1 and 11-25 from run 2, each step once."""
    first = MetricsWriter(str(tmp_path), enabled=True)
    for step in range(1, 21):
        first.write(step, {"loss": float(step)}, prefix="train/")
    with open(first.path, "a") as f:
        f.write('{"step": 21, "train/lo')  # a line cut by the kill
    second = MetricsWriter(str(tmp_path), enabled=True, keep_through=10)
    for step in range(11, 26):
        second.write(step, {"loss": 100.0 + step}, prefix="train/")
    second.close()
    want = [(s, float(s)) for s in range(1, 11)] + [(s, 100.0 + s) for s in range(11, 26)]
    assert _jsonl(second.path, "train/loss") == want
    assert [(s, round(v, 3)) for s, v in _tb_scalars(str(tmp_path / "tb"), "train/loss")] == want


def test_fresh_start_clears_an_old_log(tmp_path):
    """keep_through=-1 (no checkpoint to resume): nothing of the earlier attempt stays."""
    old = MetricsWriter(str(tmp_path), enabled=True)
    old.write(0, {"n": 1.0}, prefix="data/")
    old.write(1, {"loss": 5.0}, prefix="train/")
    new = MetricsWriter(str(tmp_path), enabled=True, keep_through=-1)
    new.write(0, {"n": 2.0}, prefix="data/")
    new.close()
    assert read_metrics(new.path) == [{"step": 0, "data/n": 2.0}]
    assert _tb_scalars(str(tmp_path / "tb"), "data/n") == [(0, 2.0)]
    assert _tb_scalars(str(tmp_path / "tb"), "train/loss") == []


def test_truncate_metrics_and_scalar_leaves(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 5, 10)))
    assert truncate_metrics(str(p), 5) == 1 and [r["step"] for r in read_metrics(str(p))] == [0, 5]
    assert truncate_metrics(str(tmp_path / "absent.jsonl"), 3) == 0 and not os.path.exists(tmp_path / "absent.jsonl")
    tree = {"off": {"overall": {"success": 0.5, "ok": True, "name": "x"}, "n": 3, "bad": float("nan")}}
    assert scalar_leaves(tree) == {"off/overall/success": 0.5, "off/n": 3.0}
