"""Entity grounding (harness/grounding.py): an invented name in a tool argument, one request name away from
the right one, is replaced before the call reaches the real sandbox; mined from failure traces into a
reviewed `grounding` proposal, released in a version, loaded by the runtime."""
from __future__ import annotations

import json
import os

from mpa_jax.envs import Action, load_tasks, make_env
from mpa_jax.harness import HarnessConfig, HarnessSession
from mpa_jax.harness import evolution
from mpa_jax.envs.episode import run_chat_episode
from mpa_jax.harness.grounding import ground_arguments, ground_value, name_runs
from mpa_jax.harness.planners import PlannerReply, ScriptedPlanner
from mpa_jax.harness.store import HarnessStore


def test_name_runs_and_ground_value():
    request = 'Find the time of the text message "Priya Walsh" and text it to Hana Costa.'
    assert name_runs(request) == ["Priya Walsh", "Hana Costa"]
    # the surname was invented: the one request name with the same first word replaces it
    assert ground_value("Hana Walsh", request, request) == ("Hana Costa", [("Hana Walsh", "Hana Costa")])
    # inside a longer value, only the name changes
    assert ground_value("Text Hana Walsh: 11:50", request, request)[0] == "Text Hana Costa: 11:50"
    # a name the episode has seen (here in a tool result) is left alone
    seen = request + '{"results": [{"name": "Hana Walsh"}]}'
    assert ground_value("Hana Walsh", seen, request) == ("Hana Walsh", [])
    # ambiguous (two request names start with "Hana") or no candidate at all: left alone
    two = "Text Hana Costa and Hana Berg."
    assert ground_value("Hana Walsh", two, two) == ("Hana Walsh", [])
    assert ground_value("Omar Chen", request, request) == ("Omar Chen", [])
    # lower-case text and single words are never touched
    assert ground_value("the time", request, request) == ("the time", [])
    assert ground_value("Hana", request, request) == ("Hana", [])


def test_ground_arguments_follows_the_rules():
    request = "Send Omar Silva the code."
    args = {"query": "Omar Chen", "limit": 3}
    assert ground_arguments(args, "search_contacts", [], request, request) == (args, [])
    out, changes = ground_arguments(args, "search_contacts", [{"tool": "search_contacts", "arg": "query"}], request, request)
    assert out == {"query": "Omar Silva", "limit": 3} and len(changes) == 1 and "Omar Chen" in changes[0]
    assert ground_arguments(args, "search_sms_messages", [{"tool": "search_contacts", "arg": "query"}], request, request)[0] == args
    assert ground_arguments(args, "anything", [{"tool": "*", "arg": "*"}], request, request)[0]["query"] == "Omar Silva"
    assert ground_arguments("not a dict", "x", [{"tool": "*", "arg": "*"}], request, request) == ("not a dict", [])


def _share_tasks(n: int):
    tasks = [t for t in load_tasks("train") if t.template == "contact.share"][:n]
    assert len(tasks) == n
    return tasks


def _recipient(task) -> str:
    """The recipient's name in a contact.share task (the gold's second search)."""
    return [g for g in task.gold if g["kind"] == "tool_call" and g["name"] == "search_contacts"][1]["arguments"]["query"]


def _invented(task) -> str:
    first = _recipient(task).split()[0]
    return f"{first} Zzyzx"  # a surname no persona has


def _episode(task, invent: bool, extra_invented_search: bool = False):
    """The gold episode, except that the recipient search uses an invented surname (`invent`): the
    planner then texts a guessed contact, as the demo's planner does after an empty search."""
    calls = [g for g in task.gold if g["kind"] == "tool_call"]
    replies = []
    for g in calls:
        args = dict(g["arguments"])
        if g["name"] == "search_contacts" and args["query"] == _recipient(task) and invent:
            args["query"] = _invented(task)
        if g["name"] == "send_sms" and invent:
            args["to"] = "contact_1" if args["to"] != "contact_1" else "contact_2"
        replies.append(PlannerReply(calls=[{"name": g["name"], "arguments": args}]))
    if extra_invented_search:
        replies.insert(0, PlannerReply(calls=[{"name": "search_contacts", "arguments": {"query": _invented(task)}}]))
    replies.append(PlannerReply(text="Done."))
    return run_chat_episode(ScriptedPlanner(replies), make_env("sandbox"), task, max_turns=8).trajectory()


def test_runtime_grounds_an_invented_name_in_the_real_sandbox(tmp_path):
    (task,) = _share_tasks(1)
    query = {"query": _invented(task)}
    plain = HarnessSession(HarnessConfig.defaults(enabled=True, skills=False)).env_factory()
    plain.reset(task)
    fb = plain.step(Action.tool_call("search_contacts", query, "c1"))
    assert fb.ok and fb.result["count"] == 0  # the invented name finds nothing

    root = str(tmp_path / "harness")
    store = HarnessStore(evolution.store_path(root))
    p = {"id": "grou-1", "kind": "grounding", "cluster": "*|UNGROUNDED_NAME|*", "payload": {"tool": "*", "arg": "*"},
         "evidence": [{"task_id": task.id}]}
    evolution.submit(store, [p], policy="auto")
    version = evolution.release(store, root)
    store.close()
    vdir = os.path.join(root, "versions", version)
    assert json.load(open(os.path.join(vdir, "grounding.json"))) == [{"tool": "*", "arg": "*"}]
    assert evolution.read_version(vdir).grounding == [{"tool": "*", "arg": "*"}]

    env = HarnessSession(HarnessConfig.defaults(enabled=True, skills=False, version_dir=vdir)).env_factory()
    env.reset(task)
    fb = env.step(Action.tool_call("search_contacts", query, "c1"))
    names = [r.get("name") for r in fb.result["results"]]
    assert fb.ok and _recipient(task) in names and env.normalised == 1
    # a name from a tool result is grounded: searching it again changes nothing
    fb = env.step(Action.tool_call("search_contacts", {"query": _recipient(task)}, "c2"))
    assert fb.ok and env.normalised == 1


def test_mine_proposes_grounding_from_failures_only_when_successes_do_not_need_it():
    tasks = _share_tasks(3)
    failed = [_episode(t, invent=True) for t in tasks[:2]]
    assert all(not t.verification.success for t in failed)
    (prop,) = [p for p in evolution.mine(failed) if p["kind"] == "grounding"]
    assert prop["payload"] == {"tool": "*", "arg": "*"} and {e["task_id"] for e in prop["evidence"]} == {t.id for t in tasks[:2]}
    assert all(e["tool"] == "search_contacts" and e["arg"] == "query" for e in prop["evidence"])
    # one failed episode is not enough evidence; two of the same task (an RL group) are
    assert not [p for p in evolution.mine(failed[:1]) if p["kind"] == "grounding"]
    assert [p["kind"] for p in evolution.mine(failed[:1] * 2) if p["kind"] == "grounding"] == ["grounding"]
    # successful episodes that also carry invented names (more than a quarter as many): no proposal
    won = [_episode(tasks[2], invent=False, extra_invented_search=True)]
    assert all(t.verification.success for t in won)
    assert not [p for p in evolution.mine(failed + won) if p["kind"] == "grounding"]
    # clean successes are no evidence either way
    clean = [_episode(t, invent=False) for t in tasks]
    assert [p["kind"] for p in evolution.mine(failed + clean) if p["kind"] == "grounding"] == ["grounding"]
