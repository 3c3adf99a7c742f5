"""Every derived seed, from one place: named streams over (base seed, integer keys).

    seeds.derive("oracle", base, task_index, variant)     # an oracle demonstration episode (data/collect.py)
    seeds.derive("sampling", base, episode_index, turn)   # a policy turn's sampling seed (the episode runner)
    seeds.derive("rl_draw", base, step, attempt)          # an RL step's task draw (rl/rollouts.py)

A stream is `(base * 1_000_003 + sum(key * multiplier)) % modulus`: its multipliers keep the keys apart and
its modulus keeps the seed a non-negative 31-bit int. Each stream reproduces the formula its caller used
before this module, so no pinned figure moved. No jax.
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
