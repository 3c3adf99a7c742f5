"""`mpa harness ACTION`: the harness's tools registry, one tool call, trace mining, review, evaluation.

    mpa harness tools [--mcp "CMD ARGS"]... [--allow a,b] [--query TEXT [--k 8]] [--json]
    mpa harness call --tool NAME --args JSON [--mcp "CMD ARGS"]...
    mpa harness mine --traces FILE... [--root DIR] [--min-count 2]
    mpa harness review [--approve ID]... [--reject ID]... [--by NAME] [--note TEXT] [--all] [--root DIR]
    mpa harness eval [--planner oracle|openai] [--url URL] [--split dev] [--max-tasks N] [--json]

MCP servers start as subprocesses (never through a shell); each `--mcp` adds one entry to
`config.harness.mcp` (a command, optionally led by name=/prefix=/rename=/allow= options, or a JSON
object; docs/harness.md). Their stderr goes to `config.harness.mcp_log`, by default <workdir>/mcp.log.
`review` approves or rejects pending proposals by id and then writes a new harness version from the
approved ones; `config.harness.review.policy=auto` (experiments) approves at mining time and the
version's manifest records it.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

ACTIONS = ("tools", "call", "mine", "review", "eval")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("examples: mpa harness tools --mcp mcp-server-time   |   mpa harness tools --query 'text Ana I am late' --k 5"
                     "   |   mpa harness eval --planner oracle --split dev --max-tasks 20")
    parser.add_argument("action", choices=ACTIONS, help="what to do")
    parser.add_argument("--mcp", action="append", default=[], metavar="ENTRY",
                        help='an MCP server: "CMD ARGS", optionally led by name=N prefix=P rename=OLD:NEW allow=a,b,'
                             ' or a JSON object {"command": [...], ...} (repeatable; each is one server)')
    parser.add_argument("--allow", default=None, help="comma-separated MCP tools to allow (default config.harness.mcp_allow)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--query", default=None, help="tools: show the catalog tools retrieved for this request")
    parser.add_argument("--k", type=int, default=None, help="tools --query: how many (default config.harness.top_k)")
    parser.add_argument("--tool", default=None, help="call: the tool name")
    parser.add_argument("--args", default="{}", help="call: the arguments as a JSON object")
    parser.add_argument("--traces", nargs="+", default=[], help="mine: Trajectory JSONL files")
    parser.add_argument("--root", default=None, help="proposals and versions (default config.harness.root)")
    parser.add_argument("--min-count", type=int, default=2, help="mine: smallest cluster that yields proposals")
    parser.add_argument("--approve", action="append", default=[], metavar="ID")
    parser.add_argument("--reject", action="append", default=[], metavar="ID")
    parser.add_argument("--by", default=None, help="review: reviewer name (default $USER)")
    parser.add_argument("--note", default="", help="review: a note stored with the decision")
    parser.add_argument("--all", action="store_true", help="review: list decided proposals too")
    parser.add_argument("--planner", default="oracle", choices=("oracle", "openai"), help="eval: planner backend")
    parser.add_argument("--url", default=None, help="eval --planner openai: base URL (e.g. http://127.0.0.1:30000/v1)")
    parser.add_argument("--split", default="dev", help="eval: task split")
    parser.add_argument("--max-tasks", type=int, default=0, help="eval: first N tasks (0 = all)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError
    from mpa_jax.harness.config import HarnessConfig, HarnessConfigError

    try:
        cfg = HarnessConfig.from_config(config)
        cfg.mcp = list(cfg.mcp) + list(args.mcp)  # one entry per --mcp: never joined, never split again
        cfg.mcp_servers  # noqa: B018 - parse now so a bad entry is a user error
        if args.allow is not None:
            cfg.mcp_allow = args.allow
        if not cfg.mcp_log:
            cfg.mcp_log = os.path.join(args.workdir, "mcp.log")  # the run's log, not the terminal
    except HarnessConfigError as e:
        raise UserError(str(e)) from None
    root = args.root or cfg.root
    if args.action == "eval":  # the Evaluator runs on the whole config (envs, context format, rollout limits)
        return _eval(args, config, cfg)
    return {"tools": _tools, "call": _call, "mine": _mine, "review": _review}[args.action](args, cfg, root)


def _session(cfg: Any) -> Any:
    from mpa_jax.errors import UserError
    from mpa_jax.harness.mcp import MCPStartError
    from mpa_jax.harness.registry import RegistryError
    from mpa_jax.harness.runtime import HarnessSession

    try:
        return HarnessSession(cfg)
    except (MCPStartError, RegistryError) as e:
        raise UserError(str(e)) from None


def _tools(args: argparse.Namespace, cfg: Any, root: str) -> int:
    if args.query is not None:
        from mpa_jax.harness.retrieval import catalog_index

        names = catalog_index().search(args.query, args.k or cfg.top_k)
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    session = _session(cfg)
    try:
        rows = session.registry.describe()
    finally:
        session.close()
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
    else:
        for r in rows:
            print(f"{r['name']:<32} {r['source']:<16} {r['description'][:80]}")
        print(f"{len(rows)} tools")
    return 0


def _call(args: argparse.Namespace, cfg: Any, root: str) -> int:
    from mpa_jax.errors import UserError

    if not args.tool:
        raise UserError("harness call needs --tool NAME")
    try:
        call_args = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise UserError(f"--args is not valid JSON: {e.msg} at position {e.pos}") from None
    if not isinstance(call_args, dict):
        raise UserError("--args must be a JSON object")
    session = _session(cfg)
    try:
        fb = harness_call(session, args.tool, call_args)
        print(json.dumps(fb.to_dict(), sort_keys=True))
    finally:
        session.close()
    return 0 if fb.ok else 1


def harness_call(session: Any, tool: str, call_args: dict[str, Any], call_id: str = "call_0") -> Any:
    """One call the way the harness makes it in an episode (docs/harness.md, "Per turn"): unknown -> UNKNOWN_TOOL
    with suggestions; arguments normalised against the schema (and approved rewrites); a provider tool's
    arguments validated by the harness before the provider sees them (INVALID_ARGUMENTS with the schema
    hint); a tool off an MCP allow-list refused (PERMISSION_DENIED); the answer capped at
    `harness.max_result_chars`. Sandbox tools run in a fresh sandbox world, which validates them itself."""
    import dataclasses

    from mpa_jax.envs import ErrorCode, Feedback
    from mpa_jax.harness.normalise import normalise_arguments, schema_hint
    from mpa_jax.harness.registry import unknown_tool_feedback
    from mpa_jax.harness.runtime import HINTS, call_provider

    reg = session.registry
    if tool not in reg:
        return unknown_tool_feedback(tool, call_id, reg.suggest(tool))
    provider = reg.provider(tool)
    if session.cfg.normalise and not reg.is_refused(tool):
        call_args, _ = normalise_arguments(call_args, reg.spec(tool).parameters, session.version.rewrites, tool)
    if provider.source != "sandbox":
        err = reg.validate(tool, call_args)
        if err:
            return Feedback.error(ErrorCode.INVALID_ARGUMENTS, err, call_id, f"{tool}: {schema_hint(reg.spec(tool).parameters)}")
    fb = call_provider(provider, tool, call_args, call_id, max_chars=int(session.cfg.max_result_chars))
    if not fb.ok and fb.error_code is not None and not fb.hint:
        fb = dataclasses.replace(fb, hint=HINTS.get(ErrorCode(fb.error_code), ""))
    return fb


def _store(root: str) -> Any:
    from mpa_jax.errors import UserError
    from mpa_jax.harness.evolution import store_path
    from mpa_jax.harness.store import HarnessStore, HarnessStoreError

    try:
        return HarnessStore(store_path(root))
    except HarnessStoreError as e:
        raise UserError(str(e)) from None


def _mine(args: argparse.Namespace, cfg: Any, root: str) -> int:
    from mpa_jax.errors import UserError
    from mpa_jax.harness import evolution as ev
    from mpa_jax.harness.store import HarnessStoreError

    if not args.traces:
        raise UserError("harness mine needs --traces FILE...")
    try:
        trajs = ev.read_traces(args.traces)
    except ev.EvolutionError as e:
        raise UserError(str(e)) from None
    try:
        evolved = ev.evolve(root, trajs, cfg.review_policy, min_count=args.min_count)
    except HarnessStoreError as e:
        raise UserError(str(e)) from None
    proposals, added, version = evolved.proposals, evolved.added, evolved.version
    out = {"traces": len(trajs), "proposals": len(proposals), "new": added, "policy": cfg.review_policy, "version": version}
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"{len(trajs)} traces -> {len(proposals)} proposals ({len(added)} new, policy {cfg.review_policy})")
        for p in proposals:
            print(f"  {p['id']:<18} {p['kind']:<18} {p['cluster']}  evidence {len(p['evidence'])}")
        if version:
            print(f"released: harness version {version} written under {root}/versions/ (approved proposals)")
    return 0


def _review(args: argparse.Namespace, cfg: Any, root: str) -> int:
    import getpass

    from mpa_jax.errors import UserError
    from mpa_jax.harness import evolution as ev
    from mpa_jax.harness.store import HarnessStoreError

    store = _store(root)
    try:
        by = args.by or getpass.getuser()
        try:
            for pid in args.approve:
                store.decide(pid, "approved", by, args.note)
            for pid in args.reject:
                store.decide(pid, "rejected", by, args.note)
        except HarnessStoreError as e:
            raise UserError(str(e)) from None
        version = None
        if args.approve:
            trajs = []
            version = ev.release(store, root, trajs)
        rows = store.proposals(None if args.all else "pending")
    finally:
        store.close()
    if args.json:
        print(json.dumps({"proposals": rows, "version": version}, sort_keys=True, default=str))
        return 0
    for r in rows:
        print(f"{r['id']:<18} {r['status']:<9} {r['kind']:<18} {r['cluster']}  evidence {len(r['evidence'])}"
              f"{'  -> ' + r['version'] if r['version'] else ''}")
        print("    " + json.dumps(r["payload"], sort_keys=True)[:200])
    if not rows:
        print("no pending proposals" if not args.all else "no proposals")
    if version:
        print(f"harness version {version} written under {root}/versions/{version}")
    return 0


def _eval(args: argparse.Namespace, config: Any, cfg: Any) -> int:
    """Success on a split with the harness off and on (task tools; catalog retrieval; + memory), side by side:
    four `Evaluator.evaluate` calls (one eval.json each under <workdir>/harness-eval/<planner>-<split>-<n>/<setting>/)."""
    import dataclasses

    from mpa_jax.errors import UserError
    from mpa_jax.envs import load_tasks
    from mpa_jax.eval import ORACLE, Evaluator

    tasks = load_tasks(args.split)
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    if args.planner == "openai" and not args.url:
        raise UserError("eval --planner openai needs --url")
    if args.planner == "openai":
        from mpa_jax.harness.planners import OpenAIChatPlanner

        planner: Any = OpenAIChatPlanner(args.url)
    else:
        planner = ORACLE
    settings = {
        "off": ("off", None),
        "on (task tools)": ("task-tools", dataclasses.replace(cfg, enabled=True, tools="task")),
        "on (catalog)": ("catalog", dataclasses.replace(cfg, enabled=True, tools="catalog")),
        "on (catalog+memory)": ("catalog-memory", dataclasses.replace(cfg, enabled=True, tools="catalog", memory=True)),
    }
    ev = Evaluator(config, tasks, progress=False)
    # a finished run under out_dir is reused (Evaluator.run): the directory names everything that selects it
    base = os.path.join(args.workdir, "harness-eval", f"{args.planner}-{args.split}-{len(tasks)}")
    results = {}
    for label, (slug, hcfg) in settings.items():
        rep = ev.evaluate(planner, out_dir=os.path.join(base, slug), harness="off" if hcfg is None else "on",
                          harness_config=hcfg, label=f"harness {label}", split=args.split)
        m = next(iter(rep["harness"].values()))
        scored = m["overall"]["tasks"]  # infra failures are counted apart, never as the planner's failure
        succ = round(m["overall"]["success"] * scored)
        results[label] = {"n": len(tasks), "scored": scored, "success": succ, "success_rate": m["overall"]["success"],
                          "infra": m["infra_failures"], "wall_s": round(rep["wall_s"], 2)}
    if args.json:
        print(json.dumps({"planner": args.planner, "split": args.split, "results": results}, sort_keys=True))
    else:
        print(f"planner {args.planner}, split {args.split}, {len(tasks)} tasks")
        for label, r in results.items():
            print(f"  harness {label:<18} success {r['success']}/{r['scored']} ({100 * r['success_rate']:.1f}%)  infra {r['infra']}  {r['wall_s']} s")
    return 0
