"""SFT data: Trajectory files -> examples -> packed fixed-length rows, deterministic and resumable.

Layout of a global batch: B rows; row r always comes from *stream* r. Each training example belongs to
exactly one stream, fixed by a seeded permutation of the file's lines, and each stream packs its own
examples (reshuffled every epoch from (seed, stream, epoch)) greedily into rows of `seq_len` tokens.
Consequences:
- the global batch sequence is a function of (file, seed, B, seq_len) only, whatever the number of
  processes or devices, so sharded and multi-host runs see exactly the batches of a one-device run;
- a process parses only the lines of the streams whose rows it holds (its shard);
- the iterator position is one (epoch, cursor) pair per stream: a [B, 2] array sharded like the
  batch rows, saved in the checkpoint by the processes that own those rows.

Packed row fields (all [T] int32): input_ids, targets (next token, same segment), loss_weights
(1 where the target is a model token of the same example), segment_ids (1, 2, ... per example; 0 =
padding) and positions (restart at 0 per example).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable, Mapping

import numpy as np

from mpa_jax.envs.contract import ContractError, Trajectory

FIELDS = ("input_ids", "targets", "loss_weights", "segment_ids", "positions")


class DataError(ValueError):
    """SFT data cannot be used; the message names the file and what is wrong."""


@dataclasses.dataclass
class Example:
    """One training sequence: token ids and the loss mask over them (1 = a model token to learn)."""

    tokens: np.ndarray  # [L] int32
    mask: np.ndarray  # [L] int32


@dataclasses.dataclass
class DataStats:
    """What loading kept and dropped (for the run log)."""

    lines: int = 0
    train_lines: int = 0
    eval_lines: int = 0
    dropped_infra: int = 0
    dropped_failed: int = 0
    dropped_no_loss: int = 0
    truncated: int = 0


def example_from_trajectory(traj: Trajectory, seq_len: int) -> tuple[Example | None, bool]:
    """(example, truncated) of a Trajectory; None when it has no loss token within the first `seq_len`."""
    tokens = np.asarray(traj.tokens, np.int32)
    mask = np.asarray(traj.loss_mask, np.int32)
    truncated = tokens.shape[0] > seq_len
    tokens, mask = tokens[:seq_len], mask[:seq_len]
    # the first token is never a target (nothing predicts it), so it cannot carry loss
    if tokens.shape[0] < 2 or int(mask[1:].sum()) == 0:
        return None, truncated
    return Example(tokens=tokens, mask=mask), truncated


# ----------------------------------------------------------------------------------------------- files


def scan_file(path: str) -> tuple[int, str]:
    """(number of non-blank lines, sha256 of the bytes) in one streaming pass; nothing is kept."""
    if not os.path.isfile(path):
        raise DataError(f"SFT data file not found: {path}")
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for line in f:
            h.update(line)
            n += bool(line.strip())
    return n, h.hexdigest()


def read_lines(path: str, keep: set[int] | None = None) -> dict[int, bytes]:
    """{index: raw line} of the non-blank lines of a JSONL file, only those in `keep` (all when None)."""
    if not os.path.isfile(path):
        raise DataError(f"SFT data file not found: {path}")
    out: dict[int, bytes] = {}
    i = 0
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            if keep is None or i in keep:
                out[i] = line
            i += 1
    return out


def _parse_line(path: str, lineno: int, line: bytes) -> Trajectory:
    try:
        return Trajectory.from_dict(json.loads(line))
    except (json.JSONDecodeError, UnicodeDecodeError, ContractError) as e:
        raise DataError(f"{path}: line {lineno + 1} is not a valid Trajectory ({e})") from None


class TrajectorySource:
    """Trajectories of a JSONL (or Parquet) file by record index.

    A JSONL file is scanned once to count its records, then only the records a process owns are read
    (`load(keep)`), and each is parsed when asked for.
    """

    def __init__(self, path: str):
        self.path = path
        self._lines: dict[int, bytes] = {}
        self._rows: list[dict[str, Any]] | None = None
        if path.endswith(".parquet"):
            if not os.path.isfile(path):
                raise DataError(f"SFT data file not found: {path}")
            self._rows = _read_parquet(path)
            self.size = len(self._rows)
            self.fingerprint = hashlib.sha256(open(path, "rb").read()).hexdigest()
        else:
            self.size, self.fingerprint = scan_file(path)
        if self.size == 0:
            raise DataError(f"SFT data file {path} holds no trajectories")

    def load(self, keep: set[int]) -> None:
        """Read the raw records with these indices (JSONL; Parquet files are read whole)."""
        if self._rows is None:
            self._lines = read_lines(self.path, keep)

    def get(self, index: int) -> Trajectory:
        if self._rows is None:
            return _parse_line(self.path, index, self._lines[index])
        try:
            return Trajectory.from_dict(self._rows[index])
        except ContractError as e:
            raise DataError(f"{self.path}: row {index} is not a valid Trajectory ({e})") from None


def _read_parquet(path: str) -> list[dict[str, Any]]:
    """Rows of a Parquet file of Trajectories (columns = Trajectory fields; nested ones as JSON strings or structs)."""
    try:
        import pyarrow.parquet as pq  # optional dependency
    except ImportError:
        raise DataError(f"reading {path} needs pyarrow (pip install pyarrow), or convert it to JSONL") from None
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        for key in ("steps", "verification", "costs", "provenance", "messages"):
            if isinstance(row.get(key), str):
                row[key] = json.loads(row[key])
    return rows


# ------------------------------------------------------------------------------------------- splitting


def split_lines(num_lines: int, num_streams: int, seed: int, eval_fraction: float) -> tuple[list[list[int]], list[list[int]]]:
    """(train line indices per stream, eval line indices per stream), from a seeded permutation."""
    perm = np.random.default_rng([seed, 0x5F7]).permutation(num_lines)
    n_eval = int(round(num_lines * eval_fraction)) if eval_fraction > 0 else 0
    if eval_fraction > 0 and n_eval == 0 and num_lines > num_streams:
        n_eval = 1
    eval_idx, train_idx = perm[:n_eval], perm[n_eval:]
    train = [sorted(int(i) for i in train_idx[r::num_streams]) for r in range(num_streams)]
    evals = [sorted(int(i) for i in eval_idx[r::num_streams]) for r in range(num_streams)]
    return train, evals


# --------------------------------------------------------------------------------------------- packing


def pack_row(examples: list[Example], seq_len: int) -> dict[str, np.ndarray]:
    """Pack whole examples (each <= seq_len, total <= seq_len) into one row of every field."""
    row = {k: np.zeros(seq_len, np.int32) for k in FIELDS}
    at = 0
    for seg, ex in enumerate(examples, start=1):
        n = ex.tokens.shape[0]
        if at + n > seq_len:
            raise ValueError("examples do not fit the row")
        sl = slice(at, at + n)
        row["input_ids"][sl] = ex.tokens
        row["targets"][at : at + n - 1] = ex.tokens[1:]
        row["loss_weights"][at : at + n - 1] = ex.mask[1:]
        row["segment_ids"][sl] = seg
        row["positions"][sl] = np.arange(n, dtype=np.int32)
        at += n
    return row


class Stream:
    """One row stream: its examples, reshuffled per epoch, packed greedily; position = (epoch, cursor)."""

    def __init__(self, examples: list[Example], seq_len: int, seed: int, index: int, *, shuffle: bool = True, cycle: bool = True):
        self.examples = examples
        self.seq_len = seq_len
        self.seed = seed
        self.index = index
        self.shuffle = shuffle
        self.cycle = cycle
        self.epoch = 0
        self.cursor = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.zeros(0, np.int64)

    def order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.examples)
            self._order = np.random.default_rng([self.seed, self.index, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def _peek(self) -> Example | None:
        if not self.examples or (not self.cycle and self.epoch > 0):
            return None
        return self.examples[int(self.order(self.epoch)[self.cursor])]

    def _advance(self) -> None:
        self.cursor += 1
        if self.cursor >= len(self.examples):
            self.epoch, self.cursor = self.epoch + 1, 0

    def next_row(self) -> dict[str, np.ndarray]:
        """The next packed row (all padding once a non-cycling stream is exhausted)."""
        chosen: list[Example] = []
        used = 0
        while True:
            ex = self._peek()
            if ex is None or used + ex.tokens.shape[0] > self.seq_len:
                break
            chosen.append(ex)
            used += ex.tokens.shape[0]
            epoch = self.epoch
            self._advance()
            if self.epoch != epoch:
                break  # an epoch ends the row: a row never holds the same example twice
        return pack_row(chosen, self.seq_len)

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.cursor

    def set_position(self, epoch: int, cursor: int) -> None:
        if epoch < 0 or not 0 <= cursor < max(1, len(self.examples)):
            raise DataError(f"stream {self.index}: position ({epoch}, {cursor}) is outside its {len(self.examples)} examples")
        self.epoch, self.cursor = int(epoch), int(cursor)


class PackedBatches:
    """The rows this process owns of every global batch, from its streams; checkpointable position."""

    def __init__(self, streams: Mapping[int, Stream], num_rows: int):
        self.streams = dict(streams)
        self.num_rows = num_rows

    def next_local(self) -> dict[int, dict[str, np.ndarray]]:
        """{global row: packed row} for the next batch."""
        return {r: s.next_row() for r, s in sorted(self.streams.items())}

    def positions(self) -> dict[int, tuple[int, int]]:
        return {r: s.position for r, s in self.streams.items()}

    def set_positions(self, positions: Mapping[int, Iterable[int]]) -> None:
        missing = sorted(set(self.streams) - set(positions))
        if missing:
            raise DataError(f"data position lacks rows {missing[:5]}")
        for r, (epoch, cursor) in positions.items():
            if r in self.streams:
                self.streams[r].set_position(epoch, cursor)


@dataclasses.dataclass
class SFTData:
    """Train and eval batch iterators of one process, plus what loading saw."""

    train: PackedBatches
    eval_streams: dict[int, list[Example]]
    seq_len: int
    num_rows: int
    fingerprint: str
    stats: DataStats

    def eval_batches(self, n: int) -> list[dict[int, dict[str, np.ndarray]]]:
        """`n` fixed held-out batches (same every call; no shuffling, no cycling)."""
        streams = {r: Stream(exs, self.seq_len, 0, r, shuffle=False, cycle=False) for r, exs in self.eval_streams.items()}
        it = PackedBatches(streams, self.num_rows)
        return [it.next_local() for _ in range(n)]

    @property
    def has_eval(self) -> bool:
        return any(self.eval_streams.values())


def load_sft_data(
    path: str,
    *,
    seq_len: int,
    num_rows: int,
    local_rows: Iterable[int],
    seed: int,
    eval_fraction: float = 0.0,
    only_success: bool = False,
) -> SFTData:
    """Build this process's share of the SFT data: parses only the lines of `local_rows`' streams."""
    if seq_len < 2:
        raise DataError(f"sft.seq_len must be at least 2, got {seq_len}")
    source = TrajectorySource(path)
    train_lines, eval_lines = split_lines(source.size, num_rows, seed, eval_fraction)
    n_train = sum(len(x) for x in train_lines)
    if n_train < num_rows:
        raise DataError(
            f"SFT data {path} has {n_train} training trajectories, fewer than the {num_rows} rows of a batch"
            " (lower sft.batch_size or add data)"
        )
    stats = DataStats(lines=source.size, train_lines=n_train, eval_lines=sum(len(x) for x in eval_lines))

    def examples_of(indices: list[int]) -> list[Example]:
        out = []
        for i in indices:
            traj = source.get(i)
            if traj.infra_failure:
                stats.dropped_infra += 1
                continue
            if only_success and not (traj.verification is not None and traj.verification.success):
                stats.dropped_failed += 1
                continue
            ex, truncated = example_from_trajectory(traj, seq_len)
            stats.truncated += int(truncated)
            if ex is None:
                stats.dropped_no_loss += 1
                continue
            out.append(ex)
        return out

    local = sorted(set(int(r) for r in local_rows))
    source.load({i for r in local for i in train_lines[r] + eval_lines[r]})  # only this process' records
    streams: dict[int, Stream] = {}
    eval_streams: dict[int, list[Example]] = {}
    for r in local:
        exs = examples_of(train_lines[r])
        if not exs:
            raise DataError(f"SFT data {path}: batch row {r} got no usable training example (too few trajectories with loss tokens)")
        streams[r] = Stream(exs, seq_len, seed, r)
        eval_streams[r] = examples_of(eval_lines[r])
    return SFTData(
        train=PackedBatches(streams, num_rows),
        eval_streams=eval_streams,
        seq_len=seq_len,
        num_rows=num_rows,
        fingerprint=source.fingerprint,
        stats=stats,
    )
