"""Kernels: chunked and vocabulary-parallel log-probs (logprobs.py), the gated delta rule in jnp
(gated_delta.py) and its Pallas forward (gated_delta_pallas.py). Imports jax."""
