"""Shared test set-up: 8 host CPU devices for sharding tests, unless the caller chose otherwise."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# CI runs property tests derandomized (the same examples every run, so a red CI is reproducible);
# local runs keep exploring new examples, and what they find is pinned with @example.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
