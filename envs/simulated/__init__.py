"""LLM-simulated environments: the long tail of apps the sandbox has no handlers for (DESIGN §4).

A catalog of apps (smart home, social, wearables, car, pets, ...) declares entities with typed fields; each
entity gets list/get/create/update/delete tools (ToolSpecs with strict JSON-Schema parameters) and a
state table in a real SQLite store. A tool call is answered by a simulator model through any planner
backend (`backend(prompt) -> str`): the prompt holds the tool spec, the task context, the app's current
rows and the ledger of earlier calls; the reply must be one JSON object

    {"status": "ok"|"error", "result": ..., "error_code": "...", "message": "...",
     "delta": [{"op": "insert"|"update"|"delete", "table": T, "id": ID, "row"|"changes": {...}}]}

validated against a schema, then semantically: the delta's tables, ids and field types must fit the
store, a read tool must not write, and what a read returns must equal the stored rows (so later reads
agree with earlier writes). A valid delta is applied in one SQLite transaction. Replies are cached by
(tool, canonical arguments, state hash). An invalid reply is retried (`max_retries`), then the call is
INFRA and the episode infra. Simulated tasks are for training only: `reset` refuses tasks of the dev/test
splits and `refuse_simulated` keeps simulated trajectories out of benchmark scores.

One module per job; each imports only modules listed above it (type hints aside):

    catalog.py    apps, entities, typed fields, the 135 ToolSpecs (SIM_TOOLS, SIM_BY_TABLE)
    protocol.py   the simulator prompt, the reply schema, parse_reply, check_reply (semantics vs the store)
    store.py      SimState (SQLite tables, typed deltas in one transaction, state hash), SimCache
    backends.py   DeterministicSimulator, engine_backend, BACKENDS (names a config may give)
    scoring.py    the scoring rule over the end state; refuse_simulated (training only)
    env.py        SimulatedEnv, the env protocol
    tasks.py      simulated_tasks (seeded training tasks with gold calls), run_gold

This package re-exports the names the rest of the repo uses; anything else comes from its module.
"""
from mpa_jax.envs.simulated.backends import DeterministicSimulator, engine_backend
from mpa_jax.envs.simulated.catalog import SIM_BY_TABLE, SIM_TOOLS
from mpa_jax.envs.simulated.env import SimulatedEnv
from mpa_jax.envs.simulated.scoring import refuse_simulated
from mpa_jax.envs.simulated.store import SimCache
from mpa_jax.envs.simulated.tasks import run_gold, simulated_tasks

__all__ = ["SIM_BY_TABLE", "SIM_TOOLS", "DeterministicSimulator", "SimCache", "SimulatedEnv", "engine_backend",
           "refuse_simulated", "run_gold", "simulated_tasks"]
