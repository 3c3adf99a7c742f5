"""Every derived seed, from one place: named streams over (base seed, integer keys).

    seeds.derive("oracle", base, task_index, variant)     # an oracle episode (Collector.oracle, the Evaluator's oracle)
    seeds.derive("sampling", base, episode_index, turn)   # a policy turn's sampling seed (the episode runner)
    seeds.derive("rl_draw", base, step, attempt)          # an RL step's base for "sampling" (rl/rollouts.step_seed)

A stream is `(base * 1_000_003 + sum(key * multiplier)) % modulus`: its multipliers keep the keys apart and
its modulus keeps the seed a non-negative 31-bit int. Each stream reproduces the formula its caller used
before this module, so no pinned figure moved. No jax.

What "the same task" means: an episode's seed is keyed by the task's *position* in the list of tasks the run was
given (plus the variant or turn), under the run's base seed; it is never keyed by the task's id. So the same task
gets the same seed wherever it stands at the same position under the same base:
- oracle episodes: `Collector.oracle(tasks, seed=base)` and the Evaluator's oracle source (`mpa harness eval
  --planner oracle`) both use `derive("oracle", base, i, variant)` with i the task's index in their task list
  (the Evaluator's variant is 0), so collecting and evaluating one list under one base give the same demonstration;
- policy episodes (evaluation greedy or sampled, `Collector.policy`, RL): `derive("sampling", base, i, turn)` with
  i the episode's index in the runner's list. Evaluation's base is `config.seed` and its list is the selected tasks in
  order (`eval.evaluation_tasks`: the pre-registered list order), so every evaluation of one checkpoint samples each
  task alike; the sampled mode repeats each task n times in a row, so sample j of task t is episode t*n + j. RL's base
  is `derive("rl_draw", config.seed, step, attempt)` and its list is the step's groups in order (group g, rollout
  r -> episode g * group_size + r; an infra retry re-runs the pending episodes in order under attempt + 1), so a task
  drawn again in a later step is sampled afresh.
A subset or reordering of a list therefore changes the seeds of the tasks that moved. Keying by task id instead would
move every sampled figure, the demo table and the pre-registered experiment's running arms; it is not done
(docs/architecture.md, "Still duplicated").
"""
from __future__ import annotations

BASE_MULTIPLIER = 1_000_003

# stream -> (one multiplier per key, modulus)
STREAMS: dict[str, tuple[tuple[int, ...], int]] = {
    "oracle": ((97, 1), 2**31),
    "sampling": ((10_007, 1), 2**31 - 1),
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
