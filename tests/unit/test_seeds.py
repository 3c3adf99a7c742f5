"""mpa_jax/seeds.py: the named seed streams reproduce the formulas their callers used (so no pinned figure
moves when a caller switches to it), stay in range, and name a bad stream or key count."""
import pytest

from mpa_jax import seeds


def test_streams_keep_the_callers_formulas():
    for base, a, b in [(0, 0, 0), (7, 12, 3), (2**31, 10**6, 5)]:
        assert seeds.derive("oracle", base, a, b) == (base * 1_000_003 + a * 97 + b) % (2**31)  # data/collect.py
        assert seeds.derive("sampling", base, a, b) == (base * 1_000_003 + a * 10_007 + b) % (2**31 - 1)  # runner
        assert seeds.derive("rl_draw", base, a, b) == (base * 1_000_003 + a * 7_919 + b * 104_729) % (2**31 - 1)


def test_streams_stay_apart_and_in_range():
    oracle = {seeds.derive("oracle", 0, i, v) for i in range(200) for v in range(4)}
    assert len(oracle) == 800 and all(0 <= s < 2**31 for s in oracle)


def test_bad_stream_or_keys_name_themselves():
    with pytest.raises(ValueError, match="unknown seed stream 'sample'"):
        seeds.derive("sample", 0, 1, 2)
    with pytest.raises(ValueError, match="takes 2 keys, got 1"):
        seeds.derive("oracle", 0, 1)
