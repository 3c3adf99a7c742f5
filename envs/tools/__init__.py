"""The sandbox's tools: ToolSpecs plus executors, one module per app (or per family of apps).

Table tools (search/get/create/update/delete per entity) are generated from `catalog.ENTITIES`
(tables.py); the rest are hand-written handlers, one module per app family: communication, navigation,
shop, banking, music, settings, converters, info. An executor is `fn(world, args) -> result`; it raises
`ToolError` for typed failures. Validation and preconditions run in the sandbox pipeline before the
executor (sandbox.py, preconditions.py).

    from mpa_jax.envs.tools import TOOLS, ToolError
    TOOLS["send_sms"].spec.to_openai()
"""
# The modules register their tools as they are imported, so this import order is the order of TOOLS
# (part of the benchmark's fingerprint, tests/unit/test_envs_fingerprint.py): keep it.
from mpa_jax.envs.tools.base import DELEGATE_SPEC, NETWORK, TOOLS, Tool, ToolError, handler, register  # noqa: F401
from mpa_jax.envs.tools.preconditions import check_preconditions  # noqa: F401
from mpa_jax.envs.tools import tables  # noqa: F401,E402  (table tools first)
from mpa_jax.envs.tools.communication import make_call, send_email, send_sms  # noqa: F401,E402
from mpa_jax.envs.tools.navigation import MODES, RIDE_MULT, route_km  # noqa: F401,E402
from mpa_jax.envs.tools.shop import place_order  # noqa: F401,E402
from mpa_jax.envs.tools.banking import TRANSFER_LIMIT  # noqa: F401,E402
from mpa_jax.envs.tools import music  # noqa: F401,E402
from mpa_jax.envs.tools import settings  # noqa: F401,E402
from mpa_jax.envs.tools.converters import RATES, UNITS, convert, evaluate, fx  # noqa: F401,E402
from mpa_jax.envs.tools.info import LANGUAGES, PHRASES, UTC_OFFSET, city_time, weather  # noqa: F401,E402
