"""MPA-JAX: a JAX/Flax training stack for mobile planner agents.

Importing this package stays light (no jax): `mpa_jax.envs` and `mpa_jax.harness` run on actor hosts
and devices that never load an accelerator runtime. Heavy subpackages are imported on demand.
"""
__version__ = "0.1.0"
