"""`mpa serve --checkpoint starter` (the real CLI process, no config, no hand-written instructions) driven by
the OpenAI Agents SDK (`openai-agents`, the `test` extra) through a tool round trip.

The agent's function tools are the sandbox's own tools (`search_contacts`, `delete_contact`, with their
real schemas), executed in the real sandbox env of a dev task (`Remove the contact "Ruth Meyer".`), so the
result is checked by the task's verifier, by state. The starter
planner (4.2M Qwen3, trained with `context.format=compact`) calls them on its own at temperature 0
(`tool_choice` auto on every turn): the server renders the SDK's tools as compact signatures because the
checkpoint's datasheet (read as its card, `mpa_jax.start`) says so.
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

import agents  # the OpenAI Agents SDK (the `test` extra): a missing install fails, never skips

from mpa_jax.envs.benchmark import generate_split  # noqa: E402
from mpa_jax.envs.contract import Action  # noqa: E402
from mpa_jax.envs.render import feedback_to_message  # noqa: E402
from mpa_jax.envs.sandbox import SandboxEnv  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "test-key-0123"


def _start_serve(*extra: str) -> tuple[subprocess.Popen, str]:
    """`mpa serve --checkpoint starter --port 0` as a user runs it; returns (process, base URL it printed)."""
    env = {**os.environ, "MPA_API_KEY": KEY, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.Popen([sys.executable, "-m", "mpa_jax.cli", "serve", "--checkpoint", "starter", "--port", "0",
                             "--workdir", os.path.join("/tmp", f"mpa-serve-agents-{os.getpid()}"), *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"mpa serve: (http://127\.0\.0\.1:(\d+))", line)
        if m:
            assert int(m.group(2)) > 0, line  # --port 0 prints the port the system picked
            # Keep reading the server's log: a full pipe would block the server's event loop.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("mpa serve did not print its URL:\n" + "".join(seen[-20:]))


def _sandbox_tool(env: SandboxEnv, spec, log: list) -> "agents.FunctionTool":
    """An Agents SDK function tool that runs the sandbox tool `spec` (its real schema and handler)."""

    async def invoke(_ctx, arguments: str) -> str:
        import json

        args = json.loads(arguments or "{}")
        log.append((spec.name, args))
        return feedback_to_message(env.step(Action.tool_call(spec.name, args)))["content"]

    return agents.FunctionTool(name=spec.name, description=spec.description, params_json_schema=spec.parameters,
                               on_invoke_tool=invoke, strict_json_schema=False)


def test_agents_sdk_tool_round_trip_on_the_starter():
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no trace export (no internet; nothing to send it to)
    task = next(t for t in generate_split("dev", 0, 1) if t.template == "contact.delete")
    env = SandboxEnv()
    env.reset(task)
    specs = {s.name: s for s in env.tool_specs(task)}
    log: list = []
    tools = [_sandbox_tool(env, specs[n], log) for n in ("search_contacts", "delete_contact")]
    proc, url = _start_serve()
    try:
        async def run() -> Any:
            client = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
            model = agents.OpenAIChatCompletionsModel(model="starter", openai_client=client)
            agent = agents.Agent(name="phone", tools=tools, model=model,
                                 model_settings=agents.ModelSettings(temperature=0.0, max_tokens=96))
            try:
                return await agents.Runner.run(agent, task.instruction, max_turns=6)
            finally:
                await client.close()

        result = asyncio.run(run())
        # The round trip: the model called the offered tools (parsed tool_calls, not text), the SDK ran
        # them in the sandbox, and the task's verifier finds the contact deleted and nothing else changed.
        assert [name for name, _ in log] == ["search_contacts", "delete_contact"], log
        assert log[0][1] == {"query": "Ruth Meyer"}, log  # the instruction: Remove the contact "Ruth Meyer".
        kinds = [type(item).__name__ for item in result.new_items]
        assert kinds.count("ToolCallItem") == 2 and kinds.count("ToolCallOutputItem") == 2, kinds
        answer = str(result.final_output)
        assert "<tool_call>" not in answer and "<think>" not in answer, answer
        env.step(Action.message(answer))  # the planner's final message, which the verifier reads
        verdict = env.verify()
        assert verdict.success, (answer, verdict)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        env.close()
