"""LLM-simulated env: the long-tail catalog, schema + state validation of simulator replies, the SQLite
state store, the reply cache, retries -> INFRA, and training-only use. Backends: the deterministic
simulator and the tiny embedded JAX model (random weights: its replies are garbage, the format-robustness
case)."""
from __future__ import annotations

import json

import ml_collections
import pytest

from mpa_jax.envs import Action, ErrorCode, Trajectory, make_env
from mpa_jax.envs.simulated import (SIM_BY_TABLE, SIM_TOOLS, DeterministicSimulator, SimCache, SimulatedEnv,
                                    engine_backend, refuse_simulated, run_gold, simulated_tasks)


@pytest.fixture(scope="module")
def tasks():
    return simulated_tasks(81, seed=7)


def test_catalog_has_at_least_100_tools_with_specs_and_tables():
    assert len(SIM_TOOLS) >= 100
    apps = {t.spec.app for t in SIM_TOOLS.values()}
    assert {"smarthome", "social", "wearables"} <= apps
    for name, tool in SIM_TOOLS.items():
        assert tool.spec.parameters["additionalProperties"] is False
        assert tool.entity.table in SIM_BY_TABLE
        assert tool.spec.to_openai()["function"]["name"] == name


def test_gold_succeeds_and_doing_nothing_fails(tasks):
    env = SimulatedEnv()
    for task in tasks:
        assert run_gold(env, task).success, task.id
        env.reset(task)
        env.step(Action.message("Done."))
        assert not env.verify().success


def test_later_reads_agree_with_earlier_writes_and_cache(tasks):
    backend = DeterministicSimulator()
    env = SimulatedEnv(backend)
    task = next(t for t in tasks if t.id.endswith(".create/7-1") or ".create/" in t.id)
    env.reset(task)
    e = SIM_TOOLS[task.tools[0]].entity
    first = e.fields[0]
    created = env.step(Action.tool_call(f"{e.app}_create_{e.name}", {first.name: "Zed's thing"} if first.type == "str" else {}))
    assert created.ok, created
    got = env.step(Action.tool_call(f"{e.app}_get_{e.name}", {"id": created.result["id"]}))
    assert got.ok and got.result == created.result
    listed = env.step(Action.tool_call(f"{e.app}_list_{e.name}", {}))
    assert created.result in listed.result["items"]
    # the store is real SQLite: the row is there
    assert env.state.rows(e.table)[created.result["id"]] == created.result
    # same call, same state -> cache hit (no backend call); after a write the state hash changes -> miss
    n = backend.calls
    again = env.step(Action.tool_call(f"{e.app}_list_{e.name}", {}))
    assert again.result == listed.result and backend.calls == n and env.cache.hits >= 1
    env.step(Action.tool_call(f"{e.app}_delete_{e.name}", {"id": created.result["id"]}))
    gone = env.step(Action.tool_call(f"{e.app}_get_{e.name}", {"id": created.result["id"]}))
    assert gone.error_code == ErrorCode.NOT_FOUND and backend.calls == n + 2
    after = env.step(Action.tool_call(f"{e.app}_list_{e.name}", {}))
    assert created.result not in after.result["items"]


def test_cache_is_shared_by_state_hash(tasks):
    cache, b1, b2 = SimCache(), DeterministicSimulator(), DeterministicSimulator()
    task = tasks[0]
    v1 = run_gold(SimulatedEnv(b1, cache=cache), task)
    v2 = run_gold(SimulatedEnv(b2, cache=cache), task)
    assert v1.success and v2.success and b1.calls > 0 and b2.calls == 0


def _lying(mutate):
    """A backend that answers like the deterministic one, then corrupts the reply with `mutate`."""
    good = DeterministicSimulator()

    def backend(prompt):
        reply = json.loads(good(prompt))
        mutate(reply)
        return json.dumps(reply)

    backend.good = good
    return backend


@pytest.mark.parametrize("mutate,why", [
    (lambda r: r["result"].get("items") and r["result"]["items"][0].update(name="Ghost"), "disagrees with the state"),
    (lambda r: r["delta"].append({"op": "delete", "table": "smarthome_lights", "id": "light_1"}), "must not change"),
    (lambda r: r.update(extra=1), "breaks the schema"),
    (lambda r: r["result"].update(items="nope"), "RETURNS schema"),
])
def test_invalid_read_replies_are_retried_then_infra(tasks, mutate, why):
    task = next(t for t in tasks if t.id.startswith("sim/smarthome_lights"))
    backend = _lying(mutate)
    env = SimulatedEnv(backend, max_retries=2)
    env.reset(task)
    before = env.state.dump()
    fb = env.step(Action.tool_call("smarthome_list_light", {}))
    assert fb.error_code == ErrorCode.INFRA and why in fb.message
    assert backend.good.calls == 3  # one try + two retries
    assert env.state.dump() == before  # nothing partial was applied
    assert env.step(Action.tool_call("smarthome_list_light", {})).error_code == ErrorCode.INFRA
    assert env.verify().infra_error


@pytest.mark.parametrize("delta,why", [
    ([{"op": "update", "table": "smarthome_lights", "id": "light_1", "changes": {"on": "yes"}}], "bad value"),
    ([{"op": "update", "table": "smarthome_lights", "id": "light_1", "changes": {"colour": "red"}}], "no field"),
    ([{"op": "update", "table": "smarthome_lights", "id": "light_9", "changes": {"on": True}}], "missing id"),
    ([{"op": "update", "table": "nope", "id": "light_1", "changes": {"on": True}}], "may only change"),
])
def test_invalid_deltas_are_rejected(tasks, delta, why):
    task = next(t for t in tasks if t.id.startswith("sim/smarthome_lights"))

    def backend(prompt):
        return json.dumps({"status": "ok", "result": {}, "delta": delta})

    env = SimulatedEnv(backend, max_retries=0)
    env.reset(task)
    fb = env.step(Action.tool_call("smarthome_update_light", {"id": "light_1", "on": True}))
    assert fb.error_code == ErrorCode.INFRA and why in fb.message


def test_garbage_replies_are_retried_and_recovered(tasks):
    backend = DeterministicSimulator(garbage_every=2)  # every second reply is prose, not JSON
    env = SimulatedEnv(backend, max_retries=2, cache=SimCache())
    for task in tasks[:10]:
        assert run_gold(env, task).success
    assert env.invalid_replies > 0


def test_backend_exceptions_become_infra(tasks):
    def backend(prompt):
        raise ConnectionError("simulator server down")

    env = SimulatedEnv(backend, max_retries=1)
    env.reset(tasks[0])
    fb = env.step(Action.tool_call(tasks[0].gold[0]["name"], tasks[0].gold[0]["arguments"]))
    assert fb.error_code == ErrorCode.INFRA and "ConnectionError" in fb.message


def test_policy_errors_stay_policy_errors(tasks):
    env = SimulatedEnv()
    env.reset(tasks[0])
    assert env.step(Action.tool_call("smarthome_update_light", {"id": 3})).error_code in (
        ErrorCode.INVALID_ARGUMENTS, ErrorCode.UNKNOWN_TOOL)
    assert env.step(Action.tool_call("send_sms", {})).error_code == ErrorCode.UNKNOWN_TOOL
    assert not env.infra


def test_training_only(tasks):
    env = SimulatedEnv()
    bench_task = tasks[0].from_dict({**tasks[0].to_dict(), "split": "test"})
    with pytest.raises(ValueError, match="training"):
        env.reset(bench_task)
    traj = Trajectory(task_id=tasks[0].id, tokens=[], loss_mask=[], logprobs=[], steps=[], provenance={"env": "simulated"})
    with pytest.raises(ValueError, match="never count in benchmark"):
        refuse_simulated([traj])
    refuse_simulated([Trajectory(task_id="x", tokens=[], loss_mask=[], logprobs=[], steps=[], provenance={"env": "sandbox"})])


def test_make_env_takes_the_backend_from_config():
    c = ml_collections.ConfigDict({"envs": {"simulated": {"backend": "deterministic", "max_retries": 4,
                                                          "concurrency": 2, "timeout_s": 5.0}}})
    env = make_env("simulated", config=c)
    assert isinstance(env, SimulatedEnv) and env.max_retries == 4
    c.envs.simulated.bogus = 1
    with pytest.raises(ValueError, match="config.envs.simulated.bogus"):
        make_env("simulated", config=c)


def test_tiny_embedded_model_as_simulator_backend(tasks):
    """The tiny JAX model (random weights) through the engine interface: its text is never a valid reply,
    so each call is retried and then INFRA; nothing crashes and no state changes."""
    import jax

    from mpa_jax import models
    from mpa_jax import tokenizer as tk
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.types import SamplingParams

    tok = tk.build_tokenizer(tk.synthetic_corpus(200), 512, None)
    cfg = models.ModelConfig(family="qwen3", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096)
    engine = Engine(cfg, models.init_params(cfg, jax.random.key(0)), max_batch=1)
    backend = engine_backend(engine, tok, SamplingParams(max_new_tokens=24, temperature=1.0, seed=3))
    env = SimulatedEnv(backend, max_retries=1)
    task = tasks[0]
    env.reset(task)
    before = env.state.dump()
    fb = env.step(Action.tool_call(task.gold[0]["name"], task.gold[0]["arguments"]))
    assert fb.error_code == ErrorCode.INFRA and "attempts" in fb.message
    assert env.backend_calls == 2 and env.state.dump() == before and env.verify().infra_error
