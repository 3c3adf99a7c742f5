"""Experiment drivers over the library: `rl_lift` (can RL lift the planner on held-out tasks?) and
`care_vs_vanilla` (both algorithms from one start, several seeds). Imported only by `mpa experiment`
(`mpa_jax/commands/experiment.py`), tests and bench scripts; nothing in the library imports them.
"""
