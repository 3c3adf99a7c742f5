"""Kernels: Pallas kernels and their pure-jnp references. Imports jax."""
