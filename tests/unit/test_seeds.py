"""mpa_jax/seeds.py: the named seed streams keep their formulas, stay in range, key episodes by the task id (a stable
hash, not the list position) and name a bad stream, key count or task id."""
import zlib

import pytest

from mpa_jax import seeds


def test_streams_keep_the_callers_formulas():
    for base, a, b in [(0, 0, 0), (7, 12, 3), (2**31, 10**6, 5)]:
        assert seeds.derive("oracle", base, a, b) == (base * 1_000_003 + a * 97 + b) % (2**31)  # data/collect.py
        assert seeds.derive("episode", base, a, b) == (base * 1_000_003 + a * 10_007 + b) % (2**31 - 1)  # runner
        assert seeds.derive("sampling", base, b) == (base * 1_000_003 + b) % (2**31 - 1)  # runner, per turn
        assert seeds.derive("rl_draw", base, a, b) == (base * 1_000_003 + a * 7_919 + b * 104_729) % (2**31 - 1)


def test_streams_stay_apart_and_in_range():
    oracle = {seeds.derive("oracle", 0, i, v) for i in range(200) for v in range(4)}
    assert len(oracle) == 800 and all(0 <= s < 2**31 for s in oracle)


def test_bad_stream_or_keys_name_themselves():
    with pytest.raises(ValueError, match="unknown seed stream 'sample'"):
        seeds.derive("sample", 0, 1, 2)
    with pytest.raises(ValueError, match="takes 2 keys, got 1"):
        seeds.derive("oracle", 0, 1)


def test_task_key_is_a_stable_hash_of_the_id():
    # pinned: CRC32 is the same in every process (Python's hash() of a str is salted per process)
    assert seeds.task_key("dev-0001") == zlib.crc32(b"dev-0001") == seeds.task_key("dev-0001")
    assert seeds.task_key("dev-0001") != seeds.task_key("dev-0002")
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="task_key needs a non-empty task id"):
            seeds.task_key(bad)


def test_sample_defaults_count_occurrences():
    assert seeds.occurrences(["a", "b", "a", "a", "c", "b"]) == [0, 0, 1, 2, 0, 1]
    assert seeds.occurrences([]) == []


def test_episode_seed_depends_on_the_task_and_sample_not_the_position():
    from mpa_jax.rollout.runner import episode_seed

    ids = ["t-a", "t-b", "t-c"]
    first = {t: [episode_seed(9, t, s, turn) for s in range(2) for turn in range(3)] for t in ids}
    again = {t: [episode_seed(9, t, s, turn) for s in range(2) for turn in range(3)] for t in reversed(ids)}
    assert first == again
    flat = [x for v in first.values() for x in v]
    assert len(set(flat)) == len(flat)  # tasks, samples and turns all differ
    assert episode_seed(10, "t-a", 0, 0) != episode_seed(9, "t-a", 0, 0)
