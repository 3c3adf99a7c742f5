"""AI for Data: construct tasks, collect trajectories, curate datasets, steer the next round.

    from mpa_jax.data import construct_tasks, collect_oracle, curate, generation_weights
    tasks, stats = construct_tasks(64, weights, round_index=1)        # gated, by domain x category x difficulty
    trajs = collect_oracle(tasks, tok)                                 # or collect_teacher / collect_policy
    result = curate(trajs, CurationConfig(...)); result.write("d/sft.jsonl")   # + sft.datasheet.json
    weights = generation_weights(competence_from_trajectories(eval_trajs))

No jax is imported here except by `collect_policy` (the embedded engine), lazily.
"""
from mpa_jax.data.keys import KEY_SEP, all_keys, key_of_task, key_of_trajectory  # noqa: F401
from mpa_jax.data.construct import construct_tasks  # noqa: F401
from mpa_jax.data.collect import TeacherClient, collect_oracle, collect_policy, collect_teacher, paraphraser  # noqa: F401
from mpa_jax.data.curate import CurationConfig, CurationResult, curate, failure_clusters, is_recovery  # noqa: F401
from mpa_jax.data.feedback import competence_from_trajectories, generation_weights  # noqa: F401
