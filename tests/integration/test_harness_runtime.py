"""The harness runtime against the real sandbox: context building, catalog retrieval, normalisation,
hints, skills, sub-agents, the agent loop seam (`harness.enabled`) and the Trajectory's provenance."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs import Action, ErrorCode, load_tasks, make_env
from mpa_jax.envs.contract import Task
from mpa_jax.harness import HarnessConfig, HarnessConfigError, HarnessSession
from mpa_jax.envs.oracle import run_oracle_episode
from mpa_jax.harness.planners import PlannerReply, ScriptedPlanner
from mpa_jax.harness.skills import SkillError, SkillLibrary, load_skill


@pytest.fixture(scope="module")
def dev():
    return load_tasks("dev")


@pytest.fixture(scope="module")
def tok():
    return tk.build_tokenizer(tk.synthetic_corpus(300), 2048, None)


def test_harness_never_imports_jax_flax_or_torch():
    code = ("import sys, mpa_jax.harness, mpa_jax.harness.runtime, mpa_jax.harness.planners, mpa_jax.harness.mcp, "
            "mpa_jax.harness.evolution, mpa_jax.harness.retrieval, mpa_jax.envs.episode, mpa_jax.commands.harness\n"
            "from mpa_jax.harness.planners import EnginePlanner, OpenAIChatPlanner\n"
            "bad = [m for m in ('jax', 'flax', 'torch', 'jaxlib') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_oracle_success_is_not_lowered_by_the_harness(dev):
    """Sanity row of docs/harness.md: the oracle through the harness (task tools and catalog mode)."""
    tasks = dev[::6][:80]
    off = [run_oracle_episode(make_env("sandbox"), t).verification.success for t in tasks]
    for mode in ("task", "catalog"):
        session = HarnessSession(HarnessConfig.defaults(enabled=True, tools=mode))
        on = [run_oracle_episode(session.env_factory(), t).verification.success for t in tasks]
        assert sum(on) >= sum(off) == len(tasks), mode


def test_catalog_mode_offers_retrieved_tools_and_keeps_sub_agent_roles(dev):
    session = HarnessSession(HarnessConfig.defaults(enabled=True, tools="catalog", top_k=8))
    sub = next(t for t in dev if t.roles)
    env = session.env_factory()
    obs = env.reset(sub)
    names = [t["function"]["name"] for t in obs["tools"]]
    assert "delegate" in names  # the task's roles, not retrieval's choice
    assert len([n for n in names if n not in ("delegate", "run_skill")]) == 8
    # A contact lookup request brings the contact tools it needs.
    plain = next(t for t in dev if t.category == "tool_use" and "contact" in t.instruction.lower() and not t.roles)
    obs = session.env_factory().reset(plain)
    names = {t["function"]["name"] for t in obs["tools"]}
    gold = {g["name"] for g in plain.gold if g["kind"] == "tool_call"}
    assert gold <= names, (plain.instruction, gold - names)
    env.close()


def _contact_task(**kw) -> Task:
    base = dict(id="t-harness", domain="contacts", category="tool_use", difficulty=1,
                instruction='Text Alex Schmidt: "See you at 7"', tools=["search_contacts", "send_sms", "convert_units"],
                verifier={}, gold=[], persona_seed=3)
    base.update(kw)
    return Task(**base)


def test_normalisation_hints_and_unknown_tool_suggestions():
    session = HarnessSession(HarnessConfig.defaults(enabled=True))
    env = session.env_factory()
    env.reset(_contact_task())
    # A number written as a string and a padded unit: the schema normaliser fixes both, the call succeeds.
    fb = env.step(Action.tool_call("convert_units", {"value": "70", "from_unit": " kg ", "to_unit": "lb"}, "c1"))
    assert fb.ok, fb
    assert env.normalised == 1
    # Missing required argument: the env's error gets a hint naming the schema.
    fb = env.step(Action.tool_call("convert_units", {"value": 3}, "c2"))
    assert fb.error_code == ErrorCode.INVALID_ARGUMENTS and "required value: number" in fb.hint
    # A typo in a tool name: UNKNOWN_TOOL with a suggestion among the offered tools.
    fb = env.step(Action.tool_call("search_contact", {"query": "Alex"}, "c3"))
    assert fb.error_code == ErrorCode.UNKNOWN_TOOL and "search_contacts" in fb.hint
    # Every error the env returns without a hint gets the code's generic one.
    fb = env.step(Action.tool_call("send_sms", {"to": "contact_999999", "body": "hi"}, "c4"))
    assert not fb.ok and fb.hint


def test_history_is_kept_within_the_token_budget(dev):
    mem = max((t for t in dev if t.history), key=lambda t: sum(len(h["content"]) for h in t.history))
    full = make_env("sandbox").reset(mem)["messages"]
    session = HarnessSession(HarnessConfig.defaults(enabled=True, context_tokens=40, skills=False))
    obs = session.env_factory().reset(mem)
    msgs = obs["messages"]
    assert msgs[-1] == full[-1] and msgs[0]["role"] == "system"
    assert len(msgs) < len(full) and "earlier turns of this conversation are not shown" in msgs[0]["content"]
    assert msgs[1]["role"] == "user" or len(msgs) == 2


def test_skills_are_versioned_files_retrieved_by_relevance_and_macros_run(tmp_path):
    lib = SkillLibrary()
    assert {"send_to_contact", "unit_conversion_fallback"} <= set(lib.skills)
    assert [s.name for s in lib.retrieve("Convert 70 kg to pounds", 1)] == ["unit_conversion_fallback"]
    assert lib.retrieve("zzz qqq", 2) == []
    # The macro runs through the runtime: search the contact, then text the id it found.
    session = HarnessSession(HarnessConfig.defaults(enabled=True, skills=True))
    env = session.env_factory()
    obs = env.reset(_contact_task())
    assert "send_to_contact" in obs["messages"][0]["content"] and "run_skill" in env.offered
    name = env.env.world.conn.execute("SELECT name FROM contacts_contacts LIMIT 1").fetchone()[0]
    fb = env.step(Action.tool_call("run_skill", {"skill": "send_to_contact", "params": {"name": name, "body": "See you at 7"}}, "s1"))
    assert fb.ok, fb
    assert [s["tool"] for s in fb.result["steps"]] == ["search_contacts", "send_sms"]
    assert [e["name"] for e in env.env.ledger] == ["search_contacts", "send_sms"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x y", "version": "1", "description": "d", "text": "t"}))
    with pytest.raises(SkillError, match="name 'x y'"):
        load_skill(str(bad))


def test_sub_agent_runs_with_its_own_context_tools_and_ledger_attribution(dev):
    task = next(t for t in dev if t.roles and any(g["kind"] == "delegate" for g in t.gold))
    first = next(i for i, g in enumerate(task.gold) if g["kind"] == "delegate")
    role = task.gold[first]["agent"]
    calls = []
    for g in task.gold[first + 1:]:
        if g["kind"] != "tool_call":
            break
        calls.append(g)
    replies = [PlannerReply(calls=[{"name": g["name"], "arguments": g["arguments"]}], token_ids=[5, 6, 7], logprobs=[-1.0] * 3,
                            output_tokens=3, prompt_tokens=11) for g in calls]
    replies.append(PlannerReply(text="The value is found.", token_ids=[8, 9], logprobs=[-0.5, -0.5], output_tokens=2, prompt_tokens=20))
    sub = ScriptedPlanner(replies)
    session = HarnessSession(HarnessConfig.defaults(enabled=True, subagents=True), subplanner=sub)
    env = session.env_factory()
    env.reset(task)
    fb = env.step(Action.delegate(role, task.gold[first]["instruction"]))
    assert fb.ok and fb.result["agent"] == role and fb.result["answer"] == "The value is found.", fb
    assert fb.cost["subagent_output_tokens"] == 3 * len(calls) + 2
    # The sub-agent saw only its role's tools and its own instruction (not the planner's chat).
    seen_msgs, seen_tools = sub.seen[0]
    assert {t["function"]["name"] for t in seen_tools} == set(task.roles[role])
    assert seen_msgs[-1]["content"] == task.gold[first]["instruction"]
    # Every ledger entry of the sub-agent's calls carries its agent id.
    ledger = env.env.ledger
    assert [e["agent"] for e in ledger if e["type"] == "tool_call"] == [role] * len(calls)
    assert all(e["status"] == "ok" for e in ledger)
    env.close()
    from mpa_jax.envs.contract import Trajectory

    traj = Trajectory(task_id=task.id, tokens=[1], loss_mask=[1], logprobs=[-0.1], steps=[], costs={"output_tokens": 1.0})
    session.annotate(traj)
    assert traj.provenance["agents"] == {"planner": {"output_tokens": 1.0}, role: {"output_tokens": float(3 * len(calls) + 2)}}
    (run,) = traj.provenance["subagent_episodes"]
    assert run["agent"] == role and [t["token_ids"] for t in run["turns"]][-1] == [8, 9]


def test_agent_loop_with_harness_enabled_records_version_and_succeeds(tok, dev, tmp_path):
    """`harness.enabled` in the episode runner: the same scripted model, raw env vs harness env."""
    from mpa_jax.config import load_config_file
    from mpa_jax.harness.store import HarnessStore
    from mpa_jax.eval import Evaluator, eval_metrics
    from mpa_jax.rollout.testing import ScriptedEngine

    tasks = [t for t in dev if t.category == "tool_use" and not t.faults][:3]

    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.instruction in text)
        turn = text.count("<|im_start|>assistant") - 1
        g = task.gold[min(turn, len(task.gold) - 1)]
        return tk.format_tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else g["text"]

    config = load_config_file("configs/tiny.py")
    results = {}
    for enabled in (False, True):
        config.harness.enabled = enabled
        config.harness.tools = "catalog"
        config.harness.store = str(tmp_path / "traces.sqlite") if enabled else ""
        out = tmp_path / f"roll_{enabled}.jsonl"
        trajs = Evaluator(config, tasks, tokenizer=tok, progress=False).run(ScriptedEngine(tok, script), str(out), greedy=True)
        results[enabled] = eval_metrics(trajs)["overall"]
        trajs = [json.loads(line) for line in out.read_text().splitlines()]
        assert {t["provenance"]["harness_version"] for t in trajs} == ({"0.1.0"} if enabled else {"none"})
        if enabled:
            assert all(t["provenance"]["harness"]["mode"] == "catalog" for t in trajs)
    assert results[True]["success"] == results[False]["success"] == 1.0
    with HarnessStore(str(tmp_path / "traces.sqlite")) as store:
        kinds = [s["kind"] for s in store.steps()]
        assert kinds.count("reset") == len(tasks) and kinds.count("verify") == len(tasks) and "feedback" in kinds


def test_bad_harness_config_names_the_key():
    import os

    from mpa_jax.config import load_config_file

    tiny = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "tiny.py")
    c = load_config_file(tiny)
    c.harness.tools = "everything"
    with pytest.raises(HarnessConfigError, match="config.harness.tools"):
        HarnessConfig.from_config(c)
    c = load_config_file(tiny)
    c.harness.nope = 1
    with pytest.raises(HarnessConfigError, match="harness.nope"):
        HarnessConfig.from_config(c)
    c = load_config_file(tiny)
    del c.harness["top_k"]  # configs/ is the one source of defaults: a missing key is an error, not a default
    with pytest.raises(HarnessConfigError, match="config.harness.top_k is missing"):
        HarnessConfig.from_config(c)
    assert HarnessConfig.from_config(load_config_file(tiny)).skills is False


def test_sub_agents_in_the_token_loop_through_the_runner(tok, dev, tmp_path):
    """`harness.subagents`: the planner delegates, the sub-agent runs as its own engine calls (its own
    prompt and tools), the planner's Trajectory keeps the sub-agent's sampled ids apart."""
    from mpa_jax.config import load_config_file
    from mpa_jax.eval import Evaluator, eval_metrics
    from mpa_jax.rollout.testing import ScriptedEngine

    tasks = [t for t in dev if t.roles and [g["kind"] for g in t.gold].count("delegate") == 2][:2]
    assert tasks

    def fmt(g):
        return tk.format_tool_call(g["name"], g["arguments"]) if g["kind"] == "tool_call" else g["text"]

    def script(prompt, _i):
        text = tok.decode(prompt)
        turn = text.count("<|im_start|>assistant") - 1
        if "sub-agent of a phone assistant" in text:
            for t in tasks:
                for i, g in enumerate(t.gold):
                    if g["kind"] == "delegate" and g["instruction"] in text:
                        calls = []
                        for h in t.gold[i + 1:]:
                            if h["kind"] != "tool_call":
                                break
                            calls.append(h)
                        return fmt(calls[turn]) if turn < len(calls) else "Done: the sub-task is finished."
            raise AssertionError("unknown sub-agent prompt")
        task = next(t for t in tasks if t.instruction in text)
        plan = [g for g in task.gold if g["kind"] != "tool_call"]
        g = plan[min(turn, len(plan) - 1)]
        return tk.format_tool_call("delegate", {"agent": g["agent"], "instruction": g["instruction"]}) if g["kind"] == "delegate" else g["text"]

    config = load_config_file("configs/tiny.py")
    config.harness.enabled = True
    config.harness.subagents = True
    out = tmp_path / "sub.jsonl"
    trajs = Evaluator(config, tasks, tokenizer=tok, progress=False).run(ScriptedEngine(tok, script), str(out), greedy=True)
    assert eval_metrics(trajs)["overall"]["success"] == 1.0, [t.provenance["infra_reason"] for t in trajs]
    for line in out.read_text().splitlines():
        t = json.loads(line)
        roles = [s["agent"] for s in t["provenance"]["subagent_episodes"]]
        assert len(roles) == 2 and set(roles) <= set(t["provenance"]["agents"])
        assert all(turn["token_ids"] and len(turn["token_ids"]) == len(turn["logprobs"])
                   for s in t["provenance"]["subagent_episodes"] for turn in s["turns"])
        # The planner itself made no tool calls but the two delegations and the final answer.
        assert [s["action"]["kind"] for s in t["steps"]] == ["delegate", "delegate", "message"]


def test_memory_provider_is_wired_by_config(dev):
    """`harness.memory`: issue 15's MemoryProvider offers memory tools and a memory block in the prompt."""
    mem = next(t for t in dev if t.category == "memory" and t.history)
    session = HarnessSession(HarnessConfig.defaults(enabled=True, memory=True))
    env = session.env_factory()
    obs = env.reset(mem)
    names = [t["function"]["name"] for t in obs["tools"]]
    assert {"memory_search", "memory_write"} <= set(names)
    assert "Memory (from earlier conversations" in obs["messages"][0]["content"]
    fb = env.step(Action.tool_call("memory_search", {"query": mem.instruction}, "m1"))
    assert fb.ok and fb.result["turns"]
    env.close()
    assert run_oracle_episode(session.env_factory(), mem).verification.success
    session.close()


def test_cli_eval_and_retrieval_preview(tmp_path):
    import os

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "eval", "--max-tasks", "20", "--json",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=repo)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)["results"]
    assert set(res) == {"off", "on (task tools)", "on (catalog)", "on (catalog+memory)"}
    assert all(r["success"] == r["n"] == 20 and r["infra"] == 0 for r in res.values())
    # the one evaluation path: each setting's eval.json from the Evaluator, the oracle's episodes beside it
    rep = json.loads((tmp_path / "harness-eval" / "oracle-dev-20" / "catalog" / "eval.json").read_text())
    assert rep["harness"]["on"]["overall"]["success"] == 1.0 and rep["split"] == "dev" and rep["weight_version"] == "oracle"
    assert rep["harness"]["on"]["harness_version"] == "0.1.0"
    out = subprocess.run([sys.executable, "-m", "mpa_jax.cli", "harness", "tools", "--query", "convert 70 kg to pounds",
                          "--k", "4", "--json", "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=repo)
    names = json.loads(out.stdout)
    assert len(names) == 4 and "convert_units" in names
