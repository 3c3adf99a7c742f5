"""Task generators: templates per domain and category, each producing tasks with a gold solution.

Most templates are derived from the catalog for every entity (entities.py: create / update / delete /
lookup, their memory, skill-family and sub-agent variants, and hard variants: faults, offline device,
missing information); the rest are hand-written scenarios over the handler tools, one module per domain
(utilities.py with the seed scenario, communication.py, navigation.py, shopping.py, payments.py, media.py,
device.py), composite.py for scenarios built from several domains' pieces, and followup.py for conversations
(the user's next turn after the planner's reply, category "followup").

A template is `fn(ctx) -> dict | None` returning the task's instruction, gold plan, verifier and extras;
None means "this instance cannot be built" (the generator draws another seed). Tools a task allows are
the tools its gold uses plus distractors (benchmark.py). Every candidate then goes through the quality
gate (gate.py).

    from mpa_jax.envs.taskgen import TEMPLATES
    spec = TEMPLATES[0].fn(Ctx(persona_seed, random.Random(seed)))
"""
# Each module registers its templates as it is imported, so this import order is the order of TEMPLATES
# and of the tasks in every split (pinned by tests/unit/test_envs_fingerprint.py): keep it.
from mpa_jax.envs.taskgen.registry import GENERATOR_VERSION, TEMPLATES, Ctx, Template, template  # noqa: F401
from mpa_jax.envs.taskgen.common import CHITCHAT, with_history  # noqa: F401
from mpa_jax.envs.taskgen import entities  # noqa: F401,E402  (catalog-derived templates first)
from mpa_jax.envs.taskgen import utilities  # noqa: F401,E402
from mpa_jax.envs.taskgen import communication  # noqa: F401,E402
from mpa_jax.envs.taskgen import navigation  # noqa: F401,E402
from mpa_jax.envs.taskgen import shopping  # noqa: F401,E402
from mpa_jax.envs.taskgen import payments  # noqa: F401,E402
from mpa_jax.envs.taskgen import media  # noqa: F401,E402
from mpa_jax.envs.taskgen import device  # noqa: F401,E402
from mpa_jax.envs.taskgen import composite  # noqa: F401,E402  (uses payments' transfer)
from mpa_jax.envs.taskgen import followup  # noqa: F401,E402  (conversations; after every single-request template)
from mpa_jax.envs.taskgen import injection  # noqa: F401,E402  (prompt-injection scenarios, issue 52; registered last)
