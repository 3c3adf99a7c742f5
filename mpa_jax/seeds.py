"""Every derived seed, from one place: named streams over (base seed, integer keys), keyed by the task itself.

    seeds.derive("oracle", base, task_key(task.id), variant)  # an oracle episode (Collector.oracle, the Evaluator's oracle)
    seeds.derive("episode", base, task_key(task.id), sample)  # a policy episode (the episode runner: eval, collect, RL)
    seeds.derive("sampling", episode_seed, turn)              # a policy turn's sampling seed (the episode runner)
    seeds.derive("rl_draw", base, step, attempt)              # an RL step's base for "episode" (rl/rollouts.step_seed)

A stream is `(base * 1_000_003 + sum(key * multiplier)) % modulus`: its multipliers keep the keys apart and
its modulus keeps the seed a non-negative 31-bit int. `task_key` is a stable CRC32 of the task id (never Python's
salted hash()). No jax.

What "the same task" means: an episode's seed is keyed by the task's id and a sample index, under the run's base
seed; it never depends on where the task stands in the run's list. So collecting, evaluating and training one task
under one base and sample index give the same seed, and a subset or reordering of a list moves no task's seed:
- oracle episodes: `Collector.oracle(tasks, seed=base)` uses `derive("oracle", base, task_key, variant)`; the
  Evaluator's oracle source (`mpa harness eval --planner oracle`) uses variant 0, so it replays variant 0 of the
  collection under the same base. A task listed twice gets the same demonstration.
- policy episodes: the runner's `sample` of an episode is, unless the caller passes `samples`, the occurrence count of
  its task id so far in the list (first occurrence 0, next 1, ...). A single greedy/eval episode is sample 0; the
  sampled evaluation repeats each task n times, so its samples are 0..n-1; RL passes the occurrence count of the
  task over the step's whole episode list (groups in order, group_size rollouts each), so a task drawn twice in one
  step (two groups) gets samples 0..2*group_size-1, all distinct. RL's base is `derive("rl_draw", config.seed, step,
  attempt)`: a task drawn in a later step is sampled afresh, and an infra retry re-runs its episodes with their
  samples under attempt + 1. Everything keyed here (seed, step, attempt, the drawn tasks) is restored on resume.
- greedy decoding ignores the seed, so greedy figures do not move; sampled figures (RL, sampled evaluation) moved
  on 2026-12-07 when the key changed from the list position to the task (docs/architecture.md).
"""
from __future__ import annotations

import collections
import zlib
from typing import Iterable

BASE_MULTIPLIER = 1_000_003

# stream -> (one multiplier per key, modulus)
STREAMS: dict[str, tuple[tuple[int, ...], int]] = {
    "oracle": ((97, 1), 2**31),
    "episode": ((10_007, 1), 2**31 - 1),
    "sampling": ((1,), 2**31 - 1),
    "rl_draw": ((7_919, 104_729), 2**31 - 1),
}


def derive(stream: str, base: int, *keys: int) -> int:
    """The seed of `keys` in `stream` under the run's `base` seed; a bad stream or key count names itself."""
    if stream not in STREAMS:
        raise ValueError(f"unknown seed stream {stream!r} (streams: {', '.join(STREAMS)})")
    multipliers, modulus = STREAMS[stream]
    if len(keys) != len(multipliers):
        raise ValueError(f"seed stream {stream!r} takes {len(multipliers)} keys, got {len(keys)}")
    return (int(base) * BASE_MULTIPLIER + sum(int(k) * m for k, m in zip(keys, multipliers))) % modulus


def task_key(task_id: str) -> int:
    """A stable integer key of a task id (CRC32: the same in every process, unlike Python's salted hash())."""
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"task_key needs a non-empty task id string, got {task_id!r}")
    return zlib.crc32(task_id.encode())


def occurrences(task_ids: Iterable[str]) -> list[int]:
    """Per id, how many times it occurred before in `task_ids`: the default sample index of each episode."""
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for t in task_ids:
        out.append(seen[t])
        seen[t] += 1
    return out
