"""Online RL for the planner (DESIGN §6-7): CARE and vanilla group-relative policy gradients.

`care` (advantage maths, competence table; numpy), `loss` (clipped-ratio token loss), `batch` (packing
rollouts with float per-token fields), `trainer` (`run_rl`), `experiment` (CARE vs vanilla).
Nothing here is imported by `import mpa_jax`.
"""
