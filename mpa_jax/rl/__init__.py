"""Online RL for the planner (DESIGN §6-7): CARE and vanilla group-relative policy gradients.

`care` (advantage maths, competence table; numpy), `loss` (clipped-ratio token loss), `batch` (packing
rollouts with float per-token fields), `rollouts` (task source over the env mixture, group rollouts through
the episode runner, staleness; no jax), `learner` (train state, reference, `update`), `update` (the
token-budgeted update), `trainer` (`run_rl`: the loop over the roles), `experiment` (CARE vs vanilla).
Nothing here is imported by `import mpa_jax`.
"""
