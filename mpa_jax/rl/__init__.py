"""Online RL for the planner (DESIGN §6-7): CARE and vanilla group-relative policy gradients, as roles.

Roles (what `trainer.run_rl`'s loop calls): `worker.RolloutWorker` (tasks in, scored groups out; async prefetch;
`sync(params, version)`), `advantage.Care` (advantages from rollouts and competence; the matched-arms keep rule),
`learner.Learner` (train state, reference, `update`). `trainer.run_rl` alone holds the whole config: it fits a start
(`mpa_jax.start`) and passes sections down.
Their parts: `tasks` (task source over the env mixture, cursors, competence-aware selection drawn by the competence
table; no jax), `rollouts`
(group rollouts through the episode runner, infra retries, the `Rollouts` record; no jax), `care` (the advantage
maths; numpy), `competence` (the hierarchical competence table; numpy), `loss` (clipped-ratio token loss), `batch`
(packing rollouts with float per-token fields), `update` (the token-budgeted update), `start` (config checks, the
weights of `model.init_from`), `step_log` (metrics.jsonl, competence.jsonl, the console line), `errors`.
Experiment drivers (rl-lift, care-vs-vanilla) live in `mpa_jax.experiments`. Nothing here is imported by
`import mpa_jax`.
"""
