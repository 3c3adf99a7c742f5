"""Simulator backends: anything `prompt -> reply text`. The deterministic rule-based one (tests, benches, the
default) and any planner engine as a simulator model (`engine_backend`); `BACKENDS` names those a config
can choose."""
from __future__ import annotations

import json
from typing import Any, Callable

from mpa_jax.envs.simulated.catalog import SIM_TOOLS, SimField

Backend = Callable[[str], str]


class DeterministicSimulator:
    """A rule-based simulator with the model's interface (`prompt -> reply`): reads the prompt's CALL and
    STATE lines and answers what a faithful simulator would. Tests and benches use it; `garbage_every=k`
    makes every k-th reply garbage (format robustness)."""

    def __init__(self, garbage_every: int = 0) -> None:
        self.calls = 0
        self.garbage_every = garbage_every

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        if self.garbage_every and self.calls % self.garbage_every == 0:
            return "Sure! Here is the result: {status: ok"
        line = lambda tag: json.loads(next(x for x in prompt.split("\n") if x.startswith(tag))[len(tag):])  # noqa: E731
        call, st = line("CALL: "), line("STATE: ")
        tool = SIM_TOOLS[call["name"]]
        e, args, rows, table = tool.entity, call["arguments"], st["rows"], st["table"]
        if tool.op == "list":
            q = str(args.get("query", "")).lower()
            items = [r for r in rows.values() if not q or any(q in str(v).lower() for k, v in r.items() if k != "id")]
            return json.dumps({"status": "ok", "result": {"items": items}, "delta": []})
        if tool.op == "create":
            n = 1 + max([int(i.rsplit("_", 1)[1]) for i in rows if i.rsplit("_", 1)[-1].isdigit()] or [0])
            rid = f"{e.name}_{n}"
            row = {f.name: args.get(f.name, _default(f)) for f in e.fields}
            return json.dumps({"status": "ok", "result": {"id": rid, **row},
                               "delta": [{"op": "insert", "table": table, "id": rid, "row": row}]})
        rid = args["id"]
        if rid not in rows:
            return json.dumps({"status": "error", "error_code": "NOT_FOUND", "message": f"no {e.label} {rid!r}", "delta": []})
        if tool.op == "get":
            return json.dumps({"status": "ok", "result": rows[rid], "delta": []})
        if tool.op == "update":
            changes = {k: v for k, v in args.items() if k != "id"}
            if not changes:
                return json.dumps({"status": "ok", "result": rows[rid], "delta": []})
            return json.dumps({"status": "ok", "result": {**rows[rid], **changes},
                               "delta": [{"op": "update", "table": table, "id": rid, "changes": changes}]})
        return json.dumps({"status": "ok", "result": {"deleted": rid}, "delta": [{"op": "delete", "table": table, "id": rid}]})


def _default(f: SimField) -> Any:
    """The value a create gives a field the call left out."""
    return {"bool": False, "int": int(f.lo or 0), "float": float(f.lo or 0.0)}.get(f.type, f.enum[0] if f.enum else "unnamed")


BACKENDS: dict[str, Callable[[], Backend]] = {"deterministic": DeterministicSimulator}


def engine_backend(engine: Any, tokenizer: Any, sampling: Any) -> Backend:
    """Any planner backend as a simulator: a RolloutEngine (`generate(prompts, params)`) and a tokenizer
    (`encode`/`decode`). The prompt is sent as one user turn of plain text; no jax is imported here."""

    def call(prompt: str) -> str:
        ids = tokenizer.encode(prompt)
        out = engine.generate([ids], sampling)[0]
        if getattr(out, "error", ""):
            raise RuntimeError(f"engine error: {out.error}")
        return tokenizer.decode(out.token_ids)

    return call
