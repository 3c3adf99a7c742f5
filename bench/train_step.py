"""Train-step throughput: our jitted SFT step vs transformers + torch AdamW, same config and batch.

    python bench/train_step.py [--seq-len 512] [--batch 8] [--steps 10] [--config configs/tiny.py]

Both sides: the model of `config.model` (float32), a [batch, seq_len] batch of random tokens with
every position a target, next-token cross-entropy, global-norm clipping and AdamW. Ours runs on one
device (a CPU host's cores are one device to both frameworks). Prints tokens/s for each and the ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batch(vocab: int, batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq_len + 1)).astype(np.int32)
    return {
        "input_ids": ids[:, :-1],
        "targets": ids[:, 1:],
        "loss_weights": np.ones((batch, seq_len), np.int32),
        "segment_ids": np.ones((batch, seq_len), np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)).copy(),
    }


def bench_jax(config, batch: dict[str, np.ndarray], steps: int) -> tuple[float, list[float]]:
    import jax

    from mpa_jax import models, sharding
    from mpa_jax.sft.loss import make_sft_loss
    from mpa_jax.train import optimizer as optlib
    from mpa_jax.train import state as statelib
    from mpa_jax.train import step as steplib

    cfg = models.config_from_ml(config.model)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}, devices=jax.devices()[:1])
    rules = sharding.rules_from_config(config)
    opt, sched = optlib.optimizer_from_config(config.sft)
    fam = models.registry.family_module(cfg.family)
    pshape = cfg.abstract_params()
    psh = sharding.param_shardings(cfg, mesh, rules)
    ssh = statelib.state_shardings(mesh, pshape, psh, opt)
    bsh = {k: sharding.batch_sharding(mesh, rules) for k in batch}
    state = statelib.create_sharded_state(lambda r: fam.init_params(cfg, r), opt, 0, ssh)
    step = steplib.make_train_step(make_sft_loss(cfg, int(config.model.logprob_chunk)), opt, ssh, bsh, schedule=sched)
    dev = {k: jax.device_put(v, bsh[k]) for k, v in batch.items()}
    state, m = step(state, dev)  # compile + warm-up
    jax.block_until_ready(m)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, dev)
        losses.append(m["loss"])
    jax.block_until_ready(state)
    dt = time.perf_counter() - t0
    return dt, [float(x) for x in losses]


def bench_torch(config, batch: dict[str, np.ndarray], steps: int) -> tuple[float, list[float]]:
    import torch
    import transformers

    from mpa_jax import models

    torch.manual_seed(0)
    cfg = models.config_from_ml(config.model)
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in cfg.to_hf().items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.Qwen3ForCausalLM(hf_cfg).float().train()
    sft = config.sft
    opt = torch.optim.AdamW(model.parameters(), lr=float(sft.lr), betas=(float(sft.b1), float(sft.b2)), weight_decay=float(sft.weight_decay))
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    tgt = torch.tensor(batch["targets"], dtype=torch.long)

    def one() -> float:
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(sft.clip_norm))
        opt.step()
        return float(loss.detach())

    one()  # warm-up
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(one())
    return time.perf_counter() - t0, losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "configs/tiny.py"))
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="1: both frameworks on one thread; 0: their defaults (torch also tried on 1)")
    p.add_argument("--chunk", type=int, default=0, help="override model.logprob_chunk")
    args = p.parse_args(argv)
    from mpa_jax import hostmem

    hostmem.reexec_with_huge_pages([sys.executable, __file__, *sys.argv[1:]])  # as `mpa` runs (applies to torch too)
    if args.threads == 1:
        # single-threaded XLA CPU, set before jax starts (compare with torch on one thread)
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    sys.path.insert(0, ROOT)
    from mpa_jax.config import load_config_file

    config = load_config_file(args.config)
    if args.chunk:
        config.model.logprob_chunk = args.chunk
    batch = _batch(int(config.model.vocab_size), args.batch, args.seq_len)
    tokens = args.batch * args.seq_len * args.steps
    import jax

    dt_jax, l_jax = bench_jax(config, batch, args.steps)
    print(f"config {os.path.basename(args.config)}  batch {args.batch} x {args.seq_len}  steps {args.steps}  device {jax.devices()[0].device_kind}")
    print(f"mpa-jax SFT step           {tokens / dt_jax:10.0f} tokens/s  ({dt_jax / args.steps * 1000:.1f} ms/step, first/last loss {l_jax[0]:.3f}/{l_jax[-1]:.3f})")
    if not args.skip_torch:
        import torch

        # torch with its default threads and with one thread (on a loaded machine one can be faster);
        # the faster is the baseline
        best = None
        for threads in ([1] if args.threads == 1 else sorted({torch.get_num_threads(), 1}, reverse=True)):
            torch.set_num_threads(threads)
            dt_t, l_t = bench_torch(config, batch, args.steps)
            print(f"transformers + torch AdamW {tokens / dt_t:10.0f} tokens/s  ({dt_t / args.steps * 1000:.1f} ms/step, first/last loss {l_t[0]:.3f}/{l_t[-1]:.3f}, torch threads {threads})")
            best = dt_t if best is None else min(best, dt_t)
        print(f"ratio (ours / best torch)  {best / dt_jax:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
