"""BFCL's own route next to the env route: `bfcl generate` against `mpa serve`, scored by `bfcl evaluate`.

    .venv/bin/python bench/bfcl_route.py --checkpoint starter [--max-tasks 40] [--workdir runs/bfcl_route]
        [--venv runs/bfcl_route/venv] [--env-eval runs/x/eval.json] [--score-only] [--num-threads 8]

Measured 2026-12-07 (docs/benchmark.md, "BFCL's own route"): the starter, 40 test entries, 0/40 on both routes.

Not part of `make test`: it installs BFCL with its declared dependencies (numpy==1.26.4, torch through
sentence-transformers, vendor SDKs, ...) in a venv of its own, which the project venv cannot hold.

1. The venv (`--venv`, made once): `python3 -m venv` + `pip install bfcl-eval==2026.3.23`, as BFCL's README says.
2. The tasks: the same test scenarios as `mpa eval --env bfcl --split test --max-tasks N` (the env route's
   stratified selection from `config.envs.bfcl`'s scenario split), written as BFCL's
   `test_case_ids_to_generate.json` in a scratch BFCL_PROJECT_ROOT.
3. `mpa serve --checkpoint CKPT --port 0 --served-model-name openbmb/MiniCPM-SALA-FC`: the OpenAI-compatible
   server. BFCL reaches an OpenAI-compatible endpoint through `OpenAICompletionsHandler` (function calling over
   /v1/chat/completions with `tools=`; client from OPENAI_BASE_URL / OPENAI_API_KEY). Its only registry entry
   with that handler is `openbmb/MiniCPM-SALA-FC` (BFCL's OpenAI entries use the Responses API, which mpa serve
   lacks): that name is the label BFCL files results under and the model name it sends, hence the served name;
   the weights are the checkpoint's. (`--skip-server-setup` with LOCAL_SERVER_ENDPOINT/PORT or
   REMOTE_OPENAI_BASE_URL is the route of BFCL's OSS handlers, which build prompts with a Hugging Face tokenizer
   and call the text completions endpoint; the FC handler needs neither.)
4. `bfcl generate --model openbmb/MiniCPM-SALA-FC --run-ids --temperature 0 --num-threads 8`, then
   `bfcl evaluate --model openbmb/MiniCPM-SALA-FC --test-category multi_turn --partial-eval`: BFCL's own
   inference loop (up to 20 steps per user turn, its own message assembly) and its own checker.
5. The env route for the same greedy checkpoint: `mpa eval --checkpoint CKPT --env bfcl --split test
   --max-tasks N` (or an eval.json given with `--env-eval`). Prints both per category and `BENCH_ROW {json}`.

What differs between the routes by construction (docs/benchmark.md discusses the figures): the env route
shows the project's system prompt, caps an episode at config.rollout.max_turns planner turns per user turn and
max_total_tokens, and ends an episode after config.rollout.max_output_errors malformed turns; BFCL's loop has
no system prompt, allows 20 steps per user turn, and a request the server refuses (a prompt past the
checkpoint's context) is an inference error for that entry.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

WHEEL = "bfcl-eval==2026.3.23"
# BFCL's one registry entry whose handler is `OpenAICompletionsHandler` (function calling over
# /v1/chat/completions, client from OPENAI_BASE_URL / OPENAI_API_KEY); its OpenAI entries (gpt-4o-...-FC) use
# `OpenAIResponsesHandler`, i.e. the /v1/responses API, which `mpa serve` does not offer (a 404 on every
# entry). The entry's name is only the label BFCL files the results under; the weights are the checkpoint's.
REGISTRY_NAME = "openbmb/MiniCPM-SALA-FC"
SERVED_NAME = REGISTRY_NAME  # the model name that handler sends (its ModelConfig.model_name)
CATS = ("base", "miss_func", "miss_param", "long_context")


def ensure_venv(venv: str) -> str:
    """The `bfcl` executable of `venv`, creating the venv and installing BFCL with its dependencies if needed."""
    exe = os.path.join(venv, "bin", "bfcl")
    if os.path.exists(exe):
        return exe
    print(f"bfcl_route: creating {venv} and installing {WHEEL} with its dependencies (minutes)...", flush=True)
    subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", WHEEL], check=True)
    # BFCL's CLI imports qwen-agent (an unpinned dependency); qwen-agent 0.0.34 imports soundfile without
    # declaring it, so `bfcl` fails to start without this (checked 2026-12-07)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "soundfile"], check=True)
    return exe


def select_tasks(config_name: str, n: int) -> list:
    """The env route's tasks: `mpa eval --env bfcl --split test --max-tasks n`'s selection."""
    from mpa_jax.config import load_config_file
    from mpa_jax.envs.base import kind_tasks
    from mpa_jax.eval.tasks import stratified

    config = load_config_file(config_name)
    return stratified(kind_tasks("bfcl", config, "test"), n)


def start_server(checkpoint: str, log_path: str) -> tuple[subprocess.Popen, str]:
    """`mpa serve` on a free port, its output to `log_path`; (process, base URL) once it prints its address."""
    mpa = os.path.join(os.path.dirname(sys.executable), "mpa")
    log = open(log_path, "w")
    proc = subprocess.Popen([mpa, "serve", "--checkpoint", checkpoint, "--port", "0", "--served-model-name", SERVED_NAME],
                            stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        with open(log_path) as f:
            m = re.search(r"mpa serve: (http://\S+)", f.read())
        if m:
            return proc, m.group(1)
        time.sleep(1)  # polling the log for the address line; the result does not depend on it
    proc.kill()
    raise RuntimeError(f"mpa serve did not start; see {log_path}")


def bfcl_scores(root: str) -> dict[str, dict[str, float]]:
    """Per category: accuracy and counts from `bfcl evaluate`'s score files (first line of each)."""
    out = {}
    for path in glob.glob(os.path.join(root, "score", "**", "BFCL_v4_multi_turn_*_score.json"), recursive=True):
        cat = re.search(r"BFCL_v4_multi_turn_(\w+?)_score\.json$", path).group(1)
        with open(path) as f:
            head = json.loads(f.readline())
        out[cat] = {"accuracy": float(head["accuracy"]), "correct": int(head["correct_count"]), "total": int(head["total_count"])}
    return out


def failure_kinds(root: str) -> dict[str, collections.Counter]:
    """Per category: BFCL's error types of the failed entries (the score files' later lines)."""
    out: dict[str, collections.Counter] = {}
    for path in glob.glob(os.path.join(root, "score", "**", "BFCL_v4_multi_turn_*_score.json"), recursive=True):
        cat = re.search(r"BFCL_v4_multi_turn_(\w+?)_score\.json$", path).group(1)
        with open(path) as f:
            rows = [json.loads(line) for line in f][1:]
        out[cat] = collections.Counter(str(r.get("error", {}).get("error_type", "?")) if isinstance(r.get("error"), dict)
                                       else str(r.get("error_type", "?")) for r in rows)
    return out


def inference_errors(root: str) -> int:
    """Entries whose generation BFCL recorded as an inference error (e.g. a request the server refused)."""
    n = 0
    for path in glob.glob(os.path.join(root, "result", "**", "*.json"), recursive=True):
        with open(path) as f:
            for line in f:
                if "Error during inference" in line:
                    n += 1
    return n


def env_route(eval_json: str) -> dict[str, dict[str, float]]:
    """Per category success of an `mpa eval --env bfcl` run (its eval.json)."""
    with open(eval_json) as f:
        doc = json.load(f)
    modes = doc["harness"]
    report = modes["off"] if "off" in modes else next(iter(modes.values()))
    return {k.removeprefix("bfcl_"): {"success": v["success"], "tasks": v["tasks"]} for k, v in report["by_category"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="starter")
    ap.add_argument("--config", default="starter", help="the project config whose envs.bfcl split is used")
    ap.add_argument("--max-tasks", type=int, default=40)
    ap.add_argument("--num-threads", type=int, default=8, help="BFCL's concurrent requests (mpa serve batches them)")
    ap.add_argument("--workdir", default=os.path.join(REPO, "runs", "bfcl_route"))
    ap.add_argument("--venv", default="", help="BFCL's venv (default <workdir>/venv)")
    ap.add_argument("--env-eval", default="", help="eval.json of the env route for the same checkpoint (default: run it)")
    ap.add_argument("--score-only", action="store_true",
                    help="reuse <workdir>/bfcl_root's generated results: only `bfcl evaluate` and the comparison")
    args = ap.parse_args()
    wd = os.path.abspath(args.workdir)
    os.makedirs(wd, exist_ok=True)
    bfcl = ensure_venv(os.path.abspath(args.venv or os.path.join(wd, "venv")))

    tasks = select_tasks(args.config, args.max_tasks)
    ids = collections.defaultdict(list)
    for t in tasks:
        ids[f"multi_turn_{t.metadata['bfcl_category']}"].append(t.metadata["bfcl_id"])
    root = os.path.join(wd, "bfcl_root")
    env = dict(os.environ, BFCL_PROJECT_ROOT=root, OPENAI_API_KEY="unused")
    if not args.score_only:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        with open(os.path.join(root, "test_case_ids_to_generate.json"), "w") as f:
            json.dump(dict(ids), f, indent=1)
        print(f"bfcl_route: {len(tasks)} test entries: " + ", ".join(f"{k} {len(v)}" for k, v in ids.items()), flush=True)
        proc, url = start_server(args.checkpoint, os.path.join(wd, "serve.log"))
        print(f"bfcl_route: mpa serve at {url}", flush=True)
        env["OPENAI_BASE_URL"] = url + "/v1"
        try:
            t0 = time.time()
            with open(os.path.join(wd, "generate.log"), "w") as log:
                rc = subprocess.run([bfcl, "generate", "--model", REGISTRY_NAME, "--run-ids", "--temperature", "0",
                                     "--num-threads", str(args.num_threads)], env=env, cwd=root, stdout=log,
                                    stderr=subprocess.STDOUT).returncode
            print(f"bfcl_route: bfcl generate rc {rc} in {time.time() - t0:.0f} s", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    with open(os.path.join(wd, "evaluate.log"), "w") as log:
        rc = subprocess.run([bfcl, "evaluate", "--model", REGISTRY_NAME, "--test-category", "multi_turn", "--partial-eval"],
                            env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"bfcl_route: bfcl evaluate rc {rc}", flush=True)
    theirs = bfcl_scores(root)

    eval_json = args.env_eval
    if not eval_json:
        out = os.path.join(wd, "env_route")
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpa"), "eval", "--config", args.config,
                        "--checkpoint", args.checkpoint, "--env", "bfcl", "--split", "test", "--max-tasks", str(args.max_tasks),
                        "--workdir", out, "--out", out], check=True, cwd=REPO)
        eval_json = os.path.join(out, "eval.json")
    ours = env_route(eval_json)

    print(f"\n{'category':<14} {'env route':>10} {'bfcl route':>11}")
    for c in CATS:
        a = ours.get(c, {})
        b = theirs.get(c, {})
        print(f"{c:<14} {a.get('success', float('nan')):>10.3f} {b.get('accuracy', float('nan')):>11.3f}")
    kinds = {c: dict(v) for c, v in failure_kinds(root).items()}
    print("BFCL failure types:", json.dumps(kinds))
    print("BENCH_ROW " + json.dumps({"bench": "bfcl_route", "checkpoint": args.checkpoint, "tasks": len(tasks),
                                     "env_route": ours, "bfcl_route": theirs, "bfcl_failure_types": kinds,
                                     "bfcl_inference_errors": inference_errors(root)}))


if __name__ == "__main__":
    main()
