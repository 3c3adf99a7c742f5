"""AI for Data: construct tasks, collect trajectories, curate datasets, steer the next round.

    from mpa_jax.data import Collector, construct_tasks, curate, generation_weights
    tasks, stats = construct_tasks(64, weights, round_index=1)        # gated, by domain x category x difficulty
    trajs = Collector(config, tok).oracle(tasks)                      # or .teacher(tasks, client) / .policy(...)
    result = curate(trajs, CurationConfig(...)); result.write("d/sft.jsonl")   # + sft.datasheet.json
    weights = generation_weights(competence_from_trajectories(eval_trajs))

No jax is imported here except by `Collector.policy` (the embedded engine), lazily.
"""
from mpa_jax.data.keys import KEY_SEP, all_keys, key_of_task, key_of_trajectory  # noqa: F401
from mpa_jax.data.construct import construct_tasks  # noqa: F401
from mpa_jax.data.collect import Collector, encode_episode, oracle_dataset, oracle_tasks, paraphraser  # noqa: F401
from mpa_jax.data.curate import CurationConfig, CurationResult, curate, failure_clusters, is_recovery  # noqa: F401
from mpa_jax.data.feedback import competence_from_trajectories, generation_weights  # noqa: F401
