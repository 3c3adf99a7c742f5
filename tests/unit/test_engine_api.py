"""The engine interface says what callers need, so nobody probes private attributes: the package is
grepped for `getattr` / `hasattr` of an underscore name and for reads of an engine's private attributes;
the embedded engine has the public properties instead and satisfies the StreamingEngine protocol."""
from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("mpa_jax", "kernels", "envs", "harness", "bench")
# Another object's underscore attribute (an object's own lazy attributes, `getattr(self, "_x", ...)`, are its business).
PROBE = re.compile(r"""\b(?:getattr|hasattr)\(\s*(?!self\b|cls\b)[\w.\[\]]+\s*,\s*["']_[A-Za-z]\w*["']""")
PRIVATE_READ = re.compile(r"""\b(?:engine|batcher\.engine|self\.engine)\._[A-Za-z]\w*""")


def _sources():
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8") as f:
                        yield os.path.relpath(path, ROOT), f.read()


def test_no_private_attribute_probes_in_the_package():
    found: dict[str, list[str]] = {}
    for rel, text in _sources():
        hits = PROBE.findall(text) + PRIVATE_READ.findall(text)
        if hits:
            found[rel] = hits
    assert sum(1 for _ in _sources()) > 100  # the walk saw the package
    assert found == {}


def test_the_probe_pattern_catches_what_it_is_for():
    assert PROBE.search('if hasattr(engine, "_place"):') and PROBE.search("getattr(engine, '_replica_mesh', None)")
    assert PRIVATE_READ.search("mesh = engine._replica_mesh")
    assert not PROBE.search('getattr(engine, "vocab_limit", None)') and not PRIVATE_READ.search("self._weights")
    assert not PROBE.search('getattr(self, "_hash", None)')


def test_engine_satisfies_the_streaming_protocol():
    import jax

    from mpa_jax import models
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.types import RolloutEngine, SamplingParams, StreamingEngine

    cfg = models.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=8, max_position_embeddings=128)
    engine = Engine(cfg, models.init_params(cfg, jax.random.key(0)), max_batch=2, vocab_limit=60, weight_version="w")
    assert isinstance(engine, RolloutEngine) and isinstance(engine, StreamingEngine)
    assert (engine.vocab_limit, engine.max_positions, engine.weight_version, engine.replicas) == (60, 128, "w", 1)
    assert engine.replica_mesh is None and engine.mesh is None and engine.param_sharding is not None
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], SamplingParams(max_new_tokens=2))
