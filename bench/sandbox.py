"""Sandbox throughput: read and write tool calls per second (one core), reset and verify latency.

    .venv/bin/python bench/sandbox.py [--calls 50000] [--resets 3000] [--live 64] [--rounds 40]

Env stepping as the agent loop does it (issue 16): `--live` episodes, each round one action per episode,
stepped serially in one thread vs through `envs.pool.EnvPool` (all of a round at once), for the sandbox
(threads, and inline: `concurrency=0`) and for the simulated env with a backend that takes 10 ms per reply (a remote simulator model); this part
runs on every core the process may use.

Targets (issue 4): >= 20,000 read calls/s on one core, reset < 2 ms. Every call goes through the full
pipeline (allow-list, schema validation, preconditions, fault check, execution, canonical result, ledger
entry with chained hash); resets restore the persona database by SQLite backup and apply a task patch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mpa_jax.envs import Action, Task, make_env  # noqa: E402


_all_cores = None


def _task() -> Task:
    return Task(id="bench", domain="contacts", category="tool_use", difficulty=1, instruction="bench",
                tools=["get_contact", "search_contacts", "get_note", "update_note", "create_reminder", "calculate", "send_sms"],
                verifier={"goals": [{"kind": "field", "entity": "note", "id": "note_2", "values": {"pinned": True}}]},
                gold=[], persona_seed=0,
                initial_state={"device": {"battery": 42}, "rows": {"note": [{"title": "bench note", "body": "x"}]}})


def _rate(env, actions, n: int) -> float:
    k = len(actions)
    t = time.perf_counter()
    for i in range(n):
        if i % 5000 == 0 and i:  # keep the ledger from growing without bound, as episodes do
            env.ledger.clear()
        env.step(actions[i % k])
    return n / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--resets", type=int, default=3_000)
    ap.add_argument("--live", type=int, default=64, help="live episodes for the env-stepping figures")
    ap.add_argument("--rounds", type=int, default=40, help="rounds (one action per live episode) for env stepping")
    args = ap.parse_args()
    global _all_cores
    _all_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    env = make_env("sandbox")
    task = _task()
    env.reset(task)
    reads = [Action.tool_call("get_contact", {"id": f"contact_{i}"}) for i in range(1, 21)]
    searches = [Action.tool_call("search_contacts", {"query": q}) for q in ("a", "Chen", "Sam", "zz")]
    writes = [Action.tool_call("update_note", {"id": f"note_{i}", "pinned": bool(i % 2)}) for i in range(1, 11)]
    creates = [Action.tool_call("create_reminder", {"title": "bench", "due_date": "2026-03-04"})]
    _rate(env, reads, 2000)  # warm up
    r_get = _rate(env, reads, args.calls)
    r_search = _rate(env, searches, args.calls // 5)
    r_update = _rate(env, writes, args.calls // 5)
    r_create = _rate(env, creates, args.calls // 10)
    times = []
    for _ in range(args.resets):
        t = time.perf_counter()
        env.reset(task)
        times.append(time.perf_counter() - t)
    env.step(writes[1])
    vt = []
    for _ in range(500):
        t = time.perf_counter()
        env.verify()
        vt.append(time.perf_counter() - t)
    env.close()
    ms = [x * 1e3 for x in times]
    print(f"read  get_contact      {r_get:>10,.0f} calls/s  (target >= 20,000)")
    print(f"read  search_contacts  {r_search:>10,.0f} calls/s")
    print(f"write update_note      {r_update:>10,.0f} calls/s")
    print(f"write create_reminder  {r_create:>10,.0f} calls/s")
    print(f"reset (backup + patch) median {statistics.median(ms):.3f} ms, p99 {sorted(ms)[int(len(ms) * 0.99)]:.3f} ms (target < 2 ms)")
    print(f"verify                 median {statistics.median(vt) * 1e3:.3f} ms")
    ok = r_get >= 20_000 and statistics.median(ms) < 2.0
    print("targets met" if ok else "TARGETS MISSED")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, _all_cores)
    env_stepping(args.live, args.rounds)
    return 0


def env_stepping(live: int, rounds: int) -> None:
    """Steps/s of `live` concurrent episodes, serial vs pooled (the agent loop's env-stepping part)."""
    import collections
    import json

    from mpa_jax.envs import load_tasks
    from mpa_jax.envs.pool import EnvPool, KindLimits
    from mpa_jax.envs.simulated import DeterministicSimulator, SimCache, SimulatedEnv, simulated_tasks

    dev = [t for t in load_tasks("dev") if "search_contacts" in t.tools and not t.roles][:live]
    dev = (dev * (live // max(1, len(dev)) + 1))[:live]

    def slow_backend():
        sim = DeterministicSimulator()

        def call(prompt):
            time.sleep(0.010)  # a remote simulator model's reply time
            return sim(prompt)

        return call

    def sandbox_case():
        envs = [make_env("sandbox", fault_injection=False) for _ in dev]
        for e, t in zip(envs, dev):
            e.reset(t)
        return envs, lambda r, i: Action.tool_call("search_contacts", {"query": "abcdefghij"[(r + i) % 10]})

    sims = simulated_tasks(live, seed=1)

    def simulated_case():
        envs = [SimulatedEnv(slow_backend(), cache=SimCache()) for _ in sims]
        for e, t in zip(envs, sims):
            e.reset(t)
        # distinct arguments per round, so the reply cache never answers
        return envs, lambda r, i: Action.tool_call(sims[i].tools[0], {"query": f"q{r}"})

    print(f"env stepping, {live} live episodes x {rounds} rounds (cores: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()})")
    for name, case, n_rounds in (("sandbox", sandbox_case, rounds), ("simulated (10 ms backend)", simulated_case, max(2, rounds // 10))):
        rates = collections.OrderedDict()
        for mode in ("serial", "pooled", "inline"):
            envs, act = case()
            conc = 0 if mode == "inline" else live
            with EnvPool({e.kind: KindLimits(concurrency=conc, timeout_s=60.0) for e in envs[:1]}) as pool:
                t = time.perf_counter()
                for r in range(n_rounds):
                    if mode == "serial":
                        fbs = [e.step(act(r, i)) for i, e in enumerate(envs)]
                    else:
                        fbs = pool.step_all([(e, act(r, i)) for i, e in enumerate(envs)])
                    assert all(fb.ok for fb in fbs), json.dumps(next(fb.to_dict() for fb in fbs if not fb.ok))
                rates[mode] = live * n_rounds / (time.perf_counter() - t)
            for e in envs:
                e.close()
        print(f"  {name:<26} serial {rates['serial']:>9,.0f} steps/s   pooled (threads) {rates['pooled']:>9,.0f} steps/s"
              f" ({rates['pooled'] / rates['serial']:.2f}x)   pool inline (concurrency 0) {rates['inline']:>9,.0f} steps/s"
              f" ({rates['inline'] / rates['serial']:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
