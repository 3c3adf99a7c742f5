"""Models on an accelerator in one run: bfloat16 parity with transformers, then forward+backward MFU.

    python bench/models_accel.py [--batch 2] [--seq 4096] [--steps 5] [--attention xla,cudnn]

On a CPU host (or with --size small) the timed model is a tiny stand-in: a dry run of the script
(tests/integration/test_benches.py), not a measurement.

1. Parity: tiny random Qwen3s (GQA 1/2/4, tied and untied, head_dim != hidden/heads, every parameter
   randomised), a batch with one left-padded row. Reference: transformers in float32 on the CPU. Our
   model loaded with dtype="bfloat16" on the default JAX device, and transformers in bfloat16 (on
   torch's GPU when it sees one, else the CPU), are each compared with the reference over the real
   tokens (max-abs error relative to the reference's max-abs). Ours passes within 2x transformers'
   own bfloat16 error (floor 1e-2).
2. Throughput: a Qwen3-1.7B-shaped model (float32 master weights, bfloat16 compute, tied embeddings),
   [batch, seq] random tokens, mean next-token negative log-likelihood through the chunked log-probs
   (as SFT trains), jitted value_and_grad (no optimizer). Prints ms/step, tokens/s, model TFLOP/s and
   MFU (`mpa_jax.train.metrics`: 6N + causal attention, against the device's bf16 peak or --peak-tflops).
   `--attention xla,cudnn,splash` times the same step once per `model.attention_impl` (cuDNN fused
   attention on GPU, Pallas splash attention on TPU; each falls back to XLA where it does not apply,
   so compare them on the device they are for).

Exits 1 when a parity check fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

PARITY_CONFIGS = {
    "mha_tied_hd24": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=24, tie_word_embeddings=True),
    "gqa2_untied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
    "gqa4_untied_hd8": dict(hidden_size=48, num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False),
}
# Qwen3-1.7B (configs/qwen3_1_7b.py) and a tiny stand-in for the dry run.
QWEN3_1_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0)
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0)


def parity(batch: int = 2, length: int = 32) -> bool:
    """Check every PARITY_CONFIGS model; prints one line each and returns whether all pass."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from mpa_jax import models

    accel = "cuda" if torch.cuda.is_available() else "cpu"
    ok = True
    for n, (name, kw) in enumerate(PARITY_CONFIGS.items()):
        torch.manual_seed(n)
        hf_cfg = transformers.Qwen3Config(vocab_size=256, intermediate_size=96, num_hidden_layers=2, rms_norm_eps=1e-6,
                                          max_position_embeddings=512, **kw)
        hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
        hf.config._attn_implementation = "eager"
        with torch.no_grad():
            for pname, p in hf.named_parameters():
                p.copy_(1.0 + 0.2 * torch.randn_like(p) if pname.endswith("norm.weight") else 0.1 * torch.randn_like(p))
        rng = np.random.default_rng(n)
        ids = rng.integers(0, 256, (batch, length))
        mask = np.ones((batch, length), np.int64)
        mask[0, : length // 4] = 0  # row 0 left-padded
        with torch.no_grad():
            ref = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.numpy()
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            ours = models.from_pretrained(d, dtype="bfloat16")
        got = np.asarray(models.forward(ours.cfg, ours.params, jnp.asarray(ids, jnp.int32),
                                        attention_mask=jnp.asarray(mask, jnp.int32)), np.float32)
        real = mask.astype(bool)

        def rel(x: np.ndarray) -> float:
            return float(np.abs(x - ref)[real].max() / np.abs(ref[real]).max())

        hf16 = hf.to(accel, torch.bfloat16)
        with torch.no_grad():
            t16 = hf16(input_ids=torch.as_tensor(ids, device=accel),
                       attention_mask=torch.as_tensor(mask, device=accel)).logits.float().cpu().numpy()
        err, t_err = rel(got), rel(t16)
        bound = max(2 * t_err, 1e-2)
        passed = err <= bound
        ok &= passed
        print(f"parity {name:16s} vs the float32 reference: ours bf16 {err:.2e}, transformers bf16 ({accel}) {t_err:.2e}, "
              f"bound {bound:.2e}  {'ok' if passed else 'FAIL'}")
    return ok


def throughput(shape: dict, batch: int, seq: int, steps: int, attention: str, peak_tflops: float, chunk: int) -> None:
    """Time jitted value_and_grad of the mean NLL; prints one line."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mpa_jax import models
    from mpa_jax.train import metrics

    cfg = models.ModelConfig.from_hf(dict(model_type="qwen3", tie_word_embeddings=True, rms_norm_eps=1e-6,
                                          max_position_embeddings=max(seq, 4096), **shape),
                                     param_dtype="float32", compute_dtype="bfloat16",
                                     attention_impl=attention)  # the model's own kernel selection (XLA fallback)
    params = jax.jit(lambda r: models.init_params(cfg, r))(jax.random.key(0))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1)), jnp.int32)

    def loss_fn(p):
        logp, _ = models.token_logprobs(cfg, p, ids[:, :-1], ids[:, 1:], chunk_size=chunk)
        return -jnp.mean(logp)

    step = jax.jit(jax.value_and_grad(loss_fn))
    t0 = time.perf_counter()
    loss, _ = jax.block_until_ready(step(params))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params))
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    tok_s = batch * seq / dt
    fpt = metrics.train_flops_per_token(models.param_count(cfg), cfg.num_hidden_layers, seq,
                                        cfg.num_attention_heads * cfg.head_dim)
    peak = metrics.peak_flops_per_device(override=peak_tflops * 1e12)
    mfu = metrics.mfu(tok_s, fpt, 1, peak)
    dev = jax.devices()[0]
    mem = (dev.memory_stats() or {}).get("peak_bytes_in_use") if hasattr(dev, "memory_stats") else None
    print(f"fwd+bwd {dev.device_kind} attention={attention} batch {batch} x {seq}: {dt * 1e3:.1f} ms/step (median of {steps}), "
          f"{tok_s:,.0f} tokens/s, {tok_s * fpt / 1e12:.1f} model TFLOP/s, MFU {'n/a' if mfu is None else f'{mfu:.1%}'}, "
          f"compile {compile_s:.0f} s, loss {float(loss):.3f}" + (f", peak memory {mem / 2**30:.1f} GiB" if mem else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="auto", choices=("auto", "full", "small"),
                    help="timed model: full = Qwen3-1.7B shapes, small = a tiny stand-in; auto = full unless on CPU")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=8192, help="vocabulary chunk of the log-probs")
    ap.add_argument("--attention", default="xla", help="comma-separated model.attention_impl values: xla, cudnn (GPU), splash (TPU)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device bf16 peak (default: by device kind)")
    ap.add_argument("--skip-parity", action="store_true")
    args = ap.parse_args()
    import jax

    print(f"jax {jax.__version__}, default device {jax.devices()[0].device_kind}")
    ok = args.skip_parity or parity()
    small = args.size == "small" or (args.size == "auto" and jax.default_backend() == "cpu")
    shape, seq = (SMALL, min(args.seq, 128)) if small else (QWEN3_1_7B, args.seq)
    for attention in args.attention.split(","):
        try:
            throughput(shape, args.batch, seq, args.steps, attention.strip(), args.peak_tflops, args.chunk)
        except Exception as e:  # one failed variant (say, no cuDNN attention here) must not lose the others
            print(f"fwd+bwd attention={attention.strip()}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
