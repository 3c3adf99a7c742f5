"""Shared test set-up: 8 host CPU devices for sharding tests, unless the caller chose otherwise."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
