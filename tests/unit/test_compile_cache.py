"""The one compile cache (mpa_jax.train.compiled): SFT's steps and RL's update are built through it."""
from mpa_jax.train import compiled


def test_one_cache_holds_sft_and_rl_builders_and_counts_hits():
    import mpa_jax.rl.learner  # noqa: F401  (registers compiled_update)
    import mpa_jax.sft.trainer  # noqa: F401  (registers the SFT steps)

    names = set(compiled.info())
    assert "mpa_jax.rl.learner.compiled_update" in names
    assert any(n.startswith("mpa_jax.sft.trainer.") for n in names)  # the SFT steps' builder

    built = []

    @compiled.compile_cache
    def build(key: tuple) -> list:
        built.append(key)
        return [key]

    assert build(("a", 1)) is build(("a", 1)) and built == [("a", 1)]
    name = f"{build.__module__}.{build.__qualname__}"
    assert compiled.info()[name].hits == 1
    for i in range(compiled.MAXSIZE + 1):  # bounded: the oldest program is dropped
        build(("b", i))
    build(("a", 1))
    assert built.count(("a", 1)) == 2
    compiled.clear()
    assert compiled.info()[name].currsize == 0
