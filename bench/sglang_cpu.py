"""A real SGLang 0.5.x server on this CPU against `mpa serve` on the same weights: the client's generate,
log-prob and weight-update parity, and the same client through the real sglang-router. Not part of
`make test` (SGLang is a GPU install; this runs it on CPU with a patch, see below).

    # once: SGLang in its own venv, --no-deps over the CPU torch wheel (docs/scaling.md lists the packages)
    python3 -m venv /work/sglang-venv && /work/sglang-venv/bin/pip install torch==2.13.0
    /work/sglang-venv/bin/pip install --no-deps sglang==0.5.5 triton==3.4.0 torchao==0.9.0 xgrammar==0.1.25
    /work/sglang-venv/bin/pip install <the pure-Python dependencies in docs/scaling.md>
    # then, from the repo with the project venv:
    .venv/bin/python bench/sglang_cpu.py [--sglang-python /work/sglang-venv/bin/python] [--deterministic]

What runs: two tiny random Qwen3 checkpoints A and B with the project tokenizer; SGLang serves A
(`--device cpu --attention-backend torch_native --sampling-backend pytorch --grammar-backend none
--dtype float32`, SGLang's own Qwen3 model code), `mpa serve` serves A (the embedded JAX engine, in this
process); both through `SGLangEngine`. Figures: greedy ids equal and max |log-prob diff| SGLang vs
mpa serve; SGLang's sampled tokens scored by the JAX model (teacher forcing: the behaviour-vs-learner
log-prob gap that RL's importance ratios see); the same after `update_weights(B)` (`/update_weights_from_disk`
+ `/flush_cache`), with SGLang's reported weight version; whether a repeated `sampling_seed` repeats the
sample (only with `--enable-deterministic-inference`, `--deterministic` here); and sglang-router in
front of both servers: the client's sync through router discovery and greedy ids through the router.

The patch (`--launch` mode, run by the SGLang python): SGLang 0.5.5 imports `sgl_kernel` (a CUDA/AMX
wheel) unconditionally in a few modules and, on a CPU without AMX, imports `vllm`'s RMSNorm/SiluAndMul
and `vllm._custom_ops` as fallbacks. An import hook serves `sgl_kernel` and `vllm._custom_ops` as
modules whose members raise if ever called (on this CPU SGLang dispatches every layer to its
`forward_native` torch code, so none is), and `vllm.model_executor.layers.{activation,layernorm}` as
aliases of SGLang's own classes; every other missing import stays an ImportError, so SGLang's own
fallbacks apply. Nothing is written into the SGLang install.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# ---- the CPU patch (runs in the SGLang venv; keep it free of project imports) ------------------------

_STUB = ("sgl_kernel", "vllm._custom_ops")
_ALIAS = {"vllm.model_executor.layers.activation": "sglang.srt.layers.activation",
          "vllm.model_executor.layers.layernorm": "sglang.srt.layers.layernorm"}
_ALIAS_PARENTS = {"vllm", "vllm.model_executor", "vllm.model_executor.layers"}


def _stubbed(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in _STUB)


class _Missing(type):
    """A CUDA-only member: importable, subclassable, attribute chains resolve; calling it raises."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__module__}.{cls.__name__}.{name}")


def _placeholder(qual: str) -> type:
    def fail(*_a, **_k):
        raise RuntimeError(f"{qual} is CUDA-only and unavailable in this CPU run (bench/sglang_cpu.py patch)")

    module, _, name = qual.rpartition(".")
    return _Missing(name, (), {"__init__": fail, "__call__": fail, "__module__": module})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _AliasModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(sys.modules[_ALIAS[self.__name__]], name)


class _CpuPatch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if _stubbed(name) or name in _ALIAS or name in _ALIAS_PARENTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name in _ALIAS:
            return _AliasModule(spec.name)
        module = _StubModule(spec.name) if _stubbed(spec.name) else types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_cpu_patch() -> None:
    if not any(isinstance(f, _CpuPatch) for f in sys.meta_path):
        sys.meta_path.insert(0, _CpuPatch())


if __name__ == "__mp_main__":  # SGLang's scheduler and detokenizer processes (spawn) import this file
    install_cpu_patch()

# ---- the bench (runs in the project venv) ----------------------------------------------------------

SGLANG_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
                "--grammar-backend", "none", "--dtype", "float32"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc, log: str, timeout_s: float, path: str = "/health") -> float:
    import time

    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited (code {proc.returncode}); last lines of {log}:\n{open(log).read()[-4000:]}")
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} not up after {timeout_s:.0f}s; see {log}")


def _teacher_forced(cfg, params, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    """The JAX model's log-probs of `ids` after `prompt` (full-vocabulary softmax at `temperature`)."""
    import jax.numpy as jnp

    from mpa_jax import models

    seq = prompt + ids
    x = jnp.asarray([seq[:-1]], jnp.int32)
    y = jnp.asarray([seq[1:]], jnp.int32)
    logp, _ = models.token_logprobs(cfg, params, x, y, temperature=temperature)
    return [float(v) for v in logp[0, len(prompt) - 1:]]


def _compare(a, b) -> dict:
    ids_equal = all(x.token_ids == y.token_ids for x, y in zip(a, b))
    diffs = [abs(p - q) for x, y in zip(a, b) for p, q, s, t in zip(x.logprobs, y.logprobs, x.token_ids, y.token_ids) if s == t]
    return {"ids_equal": ids_equal, "rows_equal": sum(x.token_ids == y.token_ids for x, y in zip(a, b)), "rows": len(a),
            "max_abs_logprob_diff": max(diffs) if diffs else float("nan"), "tokens_compared": len(diffs)}


def main() -> int:
    import argparse
    import json
    import os
    import subprocess
    import tempfile
    import time

    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON", "/work/sglang-venv/bin/python"),
                    help="python of the venv SGLang is installed in")
    ap.add_argument("--deterministic", action="store_true", help="start SGLang with --enable-deterministic-inference")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--no-router", action="store_true", help="skip the sglang-router part")
    ap.add_argument("--workdir", default=None, help="where checkpoints and logs go (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds SGLang may take to come up")
    args = ap.parse_args()
    if not os.path.isfile(args.sglang_python):
        raise SystemExit(f"--sglang-python {args.sglang_python} does not exist; set up the SGLang venv (docs/scaling.md)")
    version = subprocess.run([args.sglang_python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                             capture_output=True, text=True)
    if version.returncode != 0:
        raise SystemExit(f"{args.sglang_python} has no sglang: {version.stderr.strip()[-300:]}")
    sglang_version = version.stdout.strip()

    from mpa_jax import models
    from mpa_jax import tokenizer as tk
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.server import ServerThread, create_app
    from mpa_jax.rollout.sglang import SGLangEngine
    from mpa_jax.rollout.testing import tiny_checkpoint
    from mpa_jax.rollout.types import SamplingParams

    work = args.workdir or tempfile.mkdtemp(prefix="sglang_cpu_")
    os.makedirs(work, exist_ok=True)
    tok = tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)
    ck = {}
    for name, seed in (("a", 0), ("b", 3)):
        ck[name] = tiny_checkpoint(os.path.join(work, name), vocab_size=tok.vocab_size, seed=seed)
        tok.save(ck[name])  # SGLang loads the tokenizer from the model directory

    port, log = _free_port(), os.path.join(work, "sglang.log")
    cmd = [args.sglang_python, os.path.abspath(__file__), "--launch", "--model-path", ck["a"], "--host", "127.0.0.1",
           "--port", str(port), *SGLANG_FLAGS, "--max-total-tokens", "16384", "--max-running-requests", "16"]
    if args.deterministic:
        cmd.append("--enable-deterministic-inference")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    procs = []
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs.append(proc)
    sgl_url = f"http://127.0.0.1:{port}"
    report: dict = {"sglang": sglang_version, "deterministic_inference": args.deterministic, "flags": SGLANG_FLAGS}
    mpa = None
    try:
        report["sglang_startup_s"] = round(_wait_up(sgl_url, proc, log, args.timeout, "/health_generate"), 1)
        info = httpx.get(sgl_url + "/get_server_info", timeout=30).json()
        report["sglang_attention_backend"] = info.get("attention_backend")

        jax_engine = Engine.from_pretrained(ck["a"], max_batch=8, weight_version="a")
        mpa = ServerThread(create_app(jax_engine, tok, model_path=ck["a"], max_batch=8)).start()
        sgl = SGLangEngine(sgl_url, max_concurrency=8, timeout_s=300)
        ours = SGLangEngine(mpa.url, max_concurrency=8, timeout_s=300)
        for client in (sgl, ours):
            client.update_weights(ck["a"], "a")  # both report version "a" from here on
        prompts = [tok.encode(t) for t in ("set an alarm for seven", "call mom", "what is the weather in Paris tomorrow?",
                                           "send a message to Alex saying I am late", "play some jazz", "turn on wifi")]
        greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
        sampled = SamplingParams.for_ratios(max_new_tokens=args.max_new_tokens, temperature=1.0)

        def phase(name: str, path: str) -> None:
            t0 = time.perf_counter()
            g_sgl = sgl.generate(prompts, greedy)
            t_sgl = time.perf_counter() - t0
            t0 = time.perf_counter()
            g_ours = ours.generate(prompts, greedy)
            t_ours = time.perf_counter() - t0
            row = {"greedy": _compare(g_sgl, g_ours),
                   "sglang_weight_versions": sorted({r.weight_version for r in g_sgl}),
                   "sglang_model_info_weight_version": sgl.model_info().get("weight_version"),
                   "greedy_tokens_per_s": {"sglang": round(sum(len(r.token_ids) for r in g_sgl) / t_sgl, 1),
                                           "mpa_serve": round(sum(len(r.token_ids) for r in g_ours) / t_ours, 1)}}
            # SGLang's sampled tokens, scored by the JAX model on the same weights (what RL's ratios see).
            m = models.from_pretrained(path, dtype="float32")
            s_sgl = sgl.generate(prompts, sampled, seeds=list(range(len(prompts))))
            gaps = [abs(p - q) for r, pr in zip(s_sgl, prompts)
                    for p, q in zip(r.logprobs, _teacher_forced(m.cfg, m.params, pr, r.token_ids, 1.0))]
            row["sampled_vs_jax_teacher_forced_max_abs_logprob_diff"] = max(gaps)
            row["sampled_tokens_scored"] = len(gaps)
            again = sgl.generate(prompts, sampled, seeds=list(range(len(prompts))))
            row["sglang_same_seed_same_ids"] = [r.token_ids for r in again] == [r.token_ids for r in s_sgl]
            row["sglang_other_seed_same_ids"] = ([r.token_ids for r in sgl.generate(prompts, sampled, seeds=[100 + i for i in range(len(prompts))])]
                                                 == [r.token_ids for r in s_sgl])
            report[name] = row

        phase("before_update", ck["a"])
        for client in (sgl, ours):
            client.update_weights(ck["b"], "b")  # /update_weights_from_disk + /flush_cache
        phase("after_update", ck["b"])

        if not args.no_router:
            # sglang-router in front of the real SGLang server and mpa serve (same weights): the client finds
            # both through GET /workers, syncs both, and the router spreads the requests.
            rport, rlog = _free_port(), os.path.join(work, "router.log")
            rproc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", sgl_url, mpa.url,
                                      "--host", "127.0.0.1", "--port", str(rport), "--policy", "round_robin", "--log-level", "warn",
                                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())],
                                     stdout=open(rlog, "w"), stderr=subprocess.STDOUT)
            procs.append(rproc)
            router = f"http://127.0.0.1:{rport}"
            _wait_up(router, rproc, rlog, 120, "/readiness")
            deadline = time.monotonic() + 120
            while len(httpx.get(router + "/workers", timeout=10).json()["workers"]) < 2:  # registration is async
                if time.monotonic() > deadline:
                    raise SystemExit(f"sglang-router did not register both workers; see {rlog}")
                time.sleep(0.5)
            fleet = SGLangEngine(router, max_concurrency=8, timeout_s=300)
            fleet.update_weights(ck["a"], "a2")
            versions = {w.url: SGLangEngine(w.url).model_info().get("weight_version") for w in fleet.workers()}
            through = fleet.generate(prompts * 2, greedy)
            ref = SGLangEngine(mpa.url).generate(prompts * 2, greedy)
            listed = httpx.get(router + "/workers", timeout=10).json()["workers"]
            report["router"] = {"mode": fleet.mode, "workers_synced": versions,
                                "router_model_ids": sorted({w.get("model_id") for w in listed}),
                                "greedy_through_router_equals_mpa_serve": [r.token_ids for r in through] == [r.token_ids for r in ref],
                                "aborted_rows": sum(r.finish_reason == "abort" for r in through),
                                "weight_versions": sorted({r.weight_version for r in through})}
    finally:
        if mpa is not None:
            mpa.stop()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    print(json.dumps(report, indent=1))
    for name in ("before_update", "after_update"):
        r = report[name]
        print(f"{name}: greedy ids equal {r['greedy']['ids_equal']} ({r['greedy']['rows_equal']}/{r['greedy']['rows']} rows),"
              f" max |logprob diff| SGLang vs mpa serve {r['greedy']['max_abs_logprob_diff']:.2e}"
              f" over {r['greedy']['tokens_compared']} tokens; SGLang sampled vs JAX teacher-forced"
              f" {r['sampled_vs_jax_teacher_forced_max_abs_logprob_diff']:.2e}; SGLang weight version {r['sglang_weight_versions']};"
              f" same seed same ids {r['sglang_same_seed_same_ids']}, other seed same ids {r['sglang_other_seed_same_ids']}")
    if "router" in report:
        print(f"router: {report['router']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--launch":  # under the SGLang python: patch, then SGLang's own CLI
        install_cpu_patch()
        import runpy

        sys.argv = ["sglang.launch_server"] + sys.argv[2:]
        runpy.run_module("sglang.launch_server", run_name="__main__")
    else:
        sys.exit(main())
