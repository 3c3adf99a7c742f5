"""Generation speed: the embedded JAX engine vs `transformers` `generate` (torch, KV cache), one run.

Same tiny random Qwen3 weights on both sides (the `configs/tiny.py` model), batch 8, prompt 64,
128 new tokens, greedy and sampled (temperature 1), no stop tokens so both produce every token.
Prints new tokens/s of each and the ratio. Usage: `python bench/generate.py [--batch 8] [--prompt 64] [--new 128]`;
prefix `taskset -c 1` to give both sides the same single core on a shared machine (docs/perf.md).

The engine runs as `mpa rollout` runs it on a CPU host: one weight replica per core this process may
use (`--replicas`, default all of them; one XLA host device each), against torch with its default
threads (and with one thread; the faster is the baseline). With more than one replica, the
one-replica engine is timed in the same run too. Both engine paths are timed: `generate` (the batch as
requests into the engine's decode slots, chunk `--chunk`) and `generate_batch` (the whole-batch
program: one compiled prefill + decode loop per call).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=0, help="engine weight replicas (0: one per usable core)")
    ap.add_argument("--chunk", type=int, default=8, help="engine slots: decode steps per chunk")
    args = ap.parse_args(argv)
    from mpa_jax import hostmem

    hostmem.reexec_with_huge_pages([sys.executable, __file__, *sys.argv[1:]])  # as `mpa` runs (applies to torch too)
    replicas = args.replicas or len(os.sched_getaffinity(0))
    # One XLA host device per replica; read by XLA at start-up, so set before jax is imported.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={replicas}").strip()

    import jax
    import torch
    import transformers

    from mpa_jax import models
    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.types import SamplingParams

    config = load_config_file(args.config)
    cfg = models.config_from_ml(config.model)
    params = models.init_params(cfg, jax.random.key(0))
    with tempfile.TemporaryDirectory() as d:
        models.save_pretrained(models.Model(cfg, params), d, dtype="float32")
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    engines = {r: Engine(cfg, params, max_batch=args.batch, replicas=r, chunk=args.chunk,
                         slot_len=args.prompt + args.new + 4 * args.chunk) for r in sorted({replicas, 1}, reverse=True)}
    rng = np.random.default_rng(0)
    prompts = rng.integers(10, cfg.vocab_size, (args.batch, args.prompt)).tolist()
    n_tokens = args.batch * args.new
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"model: {config.name} ({models.param_count(cfg) / 1e6:.2f}M params), batch {args.batch}, "
          f"prompt {args.prompt}, {args.new} new tokens; jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    ids = torch.tensor(prompts)
    for label, temperature in (("greedy", 0.0), ("sampled T=1", 1.0)):
        sp = SamplingParams(max_new_tokens=args.new, temperature=temperature)
        first = {}
        paths = {(r, path): getattr(engine, path) for r, engine in engines.items() for path in ("generate", "generate_batch")}
        for key, run in paths.items():
            t0 = time.perf_counter()
            out = run(prompts, sp)
            first[key] = time.perf_counter() - t0
            assert all(len(x.token_ids) == args.new for x in out)

        def hf_gen() -> None:
            kw = dict(do_sample=temperature > 0, max_new_tokens=args.new, min_new_tokens=args.new,
                      pad_token_id=0, eos_token_id=None, use_cache=True)
            if temperature > 0:
                kw.update(temperature=temperature, top_k=0, top_p=1.0)
            with torch.no_grad():
                y = hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            assert y.shape[1] == args.prompt + args.new

        hf_gen()  # warm-up
        # Interleave the runs so that load from other processes hits all alike; keep each one's best.
        # torch runs both with its default thread count and with one thread (its OpenMP barriers
        # degrade badly on a busy machine); the baseline is whichever is faster.
        default_threads = torch.get_num_threads()
        t_jax = {key: float("inf") for key in paths}
        t_hf_n, t_hf_1 = float("inf"), float("inf")
        for _ in range(args.repeats):
            for key, run in paths.items():
                t_jax[key] = min(t_jax[key], _best(lambda: run(prompts, sp), 1))
            torch.set_num_threads(default_threads)
            t_hf_n = min(t_hf_n, _best(hf_gen, 1))
            torch.set_num_threads(1)
            t_hf_1 = min(t_hf_1, _best(hf_gen, 1))
        torch.set_num_threads(default_threads)
        t_hf = min(t_hf_n, t_hf_1)
        print(f"{label:12s} transformers with {default_threads} threads {n_tokens / t_hf_n:.0f} tok/s, "
              f"with 1 thread {n_tokens / t_hf_1:.0f} tok/s")
        for key in paths:
            r, path = key
            # `generate` keeps the line bench/run_all.py parses ("jax (R replicas)"); the whole-batch program is named.
            name = "" if path == "generate" else "batch program "
            print(f"{label:12s} jax {name}({r} replica{'s' if r > 1 else ''}) {n_tokens / t_jax[key]:9.0f} tok/s "
                  f"({t_jax[key] * 1e3:7.1f} ms; first call incl. compile {first[key]:5.2f} s) | transformers "
                  f"{n_tokens / t_hf:8.0f} tok/s ({t_hf * 1e3:7.1f} ms) | ratio {t_hf / t_jax[key]:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
