"""One RL iteration, ours vs TRL's GRPOTrainer, same model shape, prompt and completion lengths, one run.

    python bench/rl_step.py [--prompt-len 512] [--completion-len 128] [--tasks 8] [--group 8] [--iters 2]

An iteration = sample `group` completions of exactly `completion_len` tokens for each of `tasks`
prompts of `prompt_len` tokens at temperature 1 + rewards and group-relative advantages + one policy
update over all tasks x group sequences (+ for ours the weight sync into the sampler). No env: both
sides score completions with the same cheap function (parity of the completion's token count of even
ids), so the timing is the model work of the iteration.

Ours: the embedded `Engine` (weight replicas over the CPU devices, as `mpa rl` runs it), the
`rl.loss` clipped-ratio loss through the jitted sharded train step, `sync_weights`. TRL: `GRPOTrainer`
(trl 1.16, torch CPU, HF `generate`), loss_type "dapo" (token-level like ours), beta 0 (no KL, like
ours), one generation per step. Each side runs one warm-up iteration (compilation for ours), then
`--iters` timed ones; the ratio is TRL seconds / ours.

On a lent GPU (issue 13's device check): one RL iteration of a Qwen3-1.7B-shaped model (random
weights, configs/qwen3_1_7b.py's recipe: bf16 compute, scanned layers, remat "dots") with the
embedded engine, and where the time goes (generation, host packing, device update, weight sync,
first-iteration compile), no TRL:

    python bench/rl_step.py --shape qwen3_1_7b --device gpu --prompt-len 1024 --completion-len 256 --iters 2

`--dry-run` runs the same path at a tiny width and depth (the recipe's flags kept) on any backend:
tests/integration/test_benches.py runs it on CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prompts(vocab: int, tasks: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(10, vocab, size=prompt_len)] for _ in range(tasks)]


def _reward(token_ids) -> float:
    return float(sum(1 for t in token_ids if int(t) % 2 == 0) % 2)


def bench_ours(config, prompts: list[list[int]], group: int, completion_len: int, iters: int) -> dict[str, float]:
    """Mean times of `iters` RL iterations after one warm-up (whose wall time is reported as `first_s`)."""
    import jax
    import ml_collections

    from mpa_jax import models, sharding
    from mpa_jax.rl import batch as rlbatch
    from mpa_jax.rl import care
    from mpa_jax.rl.learner import budgeted_micro_batches, compiled_update, make_rl_optimizer, optimizer_key
    from mpa_jax.rollout.jax_engine import Engine
    from mpa_jax.rollout.engines import engine_replicas
    from mpa_jax.rollout.types import SamplingParams
    from mpa_jax.train import state as statelib

    rl = config.rl
    cfg = models.config_from_ml(config.model)
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.rules_from_config(config)
    fam = models.registry.family_module(cfg.family)
    opt, _ = make_rl_optimizer(rl, 100)
    pshape = cfg.abstract_params()
    ssh = statelib.state_shardings(mesh, pshape, sharding.param_shardings(cfg, mesh, rules), opt)
    state = statelib.create_sharded_state(lambda r: fam.init_params(cfg, r), opt, 0, ssh)
    step = compiled_update(cfg, (1.0, float(rl.clip_low), float(rl.clip_high), 0.0, int(config.model.logprob_chunk), None),
                          optimizer_key(rl, 100), mesh, rules)
    n = len(prompts) * group
    if bool(config.rollout.sharded) and jax.default_backend() != "cpu":
        engine = Engine(cfg, jax.device_get(state.params), max_batch=n, mesh=mesh, rules=rules)  # on the learner mesh
    else:
        engine = Engine(cfg, jax.device_get(state.params), max_batch=n, replicas=engine_replicas(config))
    row_shard = sharding.batch_sharding(mesh, rules, 2)
    dp = int(np.prod([mesh.shape[a] for a in ("data", "fsdp")]))
    seq_len = len(prompts[0]) + completion_len
    sp = SamplingParams.for_ratios(max_new_tokens=completion_len, temperature=1.0)
    group_ids = np.repeat(np.arange(len(prompts)), group)
    vcfg = ml_collections.ConfigDict(dict(rl.to_dict(), algo="vanilla"))

    def iteration(it: int) -> dict[str, float]:
        t0 = time.perf_counter()
        outs = engine.generate([p for p in prompts for _ in range(group)], sp, seeds=[it * 1000 + i for i in range(n)])
        t1 = time.perf_counter()
        success = np.asarray([_reward(o.token_ids) for o in outs]) > 0
        adv = care.advantages(success=success, cost=np.zeros(n), group=group_ids, key=np.zeros(n, int),
                              competence=np.zeros(n), cfg=vcfg)
        seqs = []
        for (p, o, a) in zip([p for p in prompts for _ in range(group)], outs, adv):
            toks = np.asarray(p + o.token_ids, np.int32)
            mask = np.r_[np.zeros(len(p)), np.ones(len(o.token_ids))].astype(np.float32)
            lp = np.r_[np.zeros(len(p)), np.asarray(o.logprobs)].astype(np.float32)
            seqs.append(rlbatch.RLSequence(toks, mask, lp, float(a)))
        micro, row_len, rpd = budgeted_micro_batches(seqs, seq_len, max(int(rl.tokens_per_micro_batch), seq_len), dp)
        placed = [{k: jax.device_put(v, row_shard) for k, v in mb.items()} for mb in micro]
        t_pack = time.perf_counter()
        nonlocal state
        state, m = step(state, placed)
        jax.block_until_ready(state.params)
        t2 = time.perf_counter()
        engine.update_weights(state.params, str(it + 1))  # as the trainer syncs: the engine copies on device
        jax.block_until_ready(jax.tree.leaves(engine.params))
        t3 = time.perf_counter()
        gen_tokens = float(sum(len(o.token_ids) for o in outs))
        return {"generate_s": t1 - t0, "train_s": t2 - t1, "train_host_s": t_pack - t1, "train_device_s": t2 - t_pack,
                "sync_s": t3 - t2, "total_s": t3 - t0, "completion_tokens": gen_tokens,
                "generate_tok_per_s": gen_tokens / max(t1 - t0, 1e-9), "train_tok_per_s": float(m["tokens"]) / max(t2 - t1, 1e-9),
                "micro_batches": float(len(micro)), "row_len": float(row_len), "rows_per_device": float(rpd),
                "logprob_gap": float(m["logprob_gap"])}

    t = time.perf_counter()
    iteration(0)  # compiles
    first = time.perf_counter() - t
    runs = [iteration(i + 1) for i in range(iters)]
    out = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    out["first_s"] = first
    return out


SHAPES = ("tiny", "qwen3_1_7b")


def shaped_config(shape: str, dry_run: bool):
    """configs/tiny.py, or configs/<shape>.py (the recipe); `dry_run` shrinks width, depth and vocabulary
    to a tiny model and keeps the recipe's flags (dtype, scan, remat, sharded engine)."""
    from mpa_jax.config import load_config_file

    config = load_config_file(os.path.join(ROOT, "configs", f"{shape}.py"))
    if dry_run:
        m = config.model
        m.hidden_size, m.intermediate_size, m.num_hidden_layers = 64, 128, 2
        m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.vocab_size = 4, 2, 16, 512
        m.logprob_chunk = 256
    return config


def bench_trl(config, prompts: list[list[int]], group: int, completion_len: int, iters: int, tokenizer_dir: str) -> dict[str, float]:
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from mpa_jax import models

    torch.manual_seed(0)
    cfg = models.config_from_ml(config.model)
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in cfg.to_hf().items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.Qwen3ForCausalLM(hf_cfg).float()
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # Texts that tokenise to the prompt length (decode random ids, re-encode, trim; a few rounds).
    texts = []
    for p in prompts:
        ids = list(p)
        for _ in range(5):
            text = tok.decode(ids)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= len(p):
                ids = ids[: len(p)]
            else:
                ids = ids + list(p[: len(p) - len(ids)])
        texts.append(tok.decode(ids))
    prompt_lens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    ds = datasets.Dataset.from_dict({"prompt": texts * (iters + 2)})

    def reward(completions, completion_ids=None, **kw):
        return [_reward(c) for c in completion_ids]

    times: list[float] = []
    gen_tokens: list[int] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    n = len(prompts) * group
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=n, num_generations=group, max_completion_length=completion_len,
            max_steps=iters + 1, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", beta=0.0,
            temperature=1.0, top_k=0, top_p=1.0, loss_type="dapo", epsilon=float(config.rl.clip_low),
            epsilon_high=float(config.rl.clip_high), learning_rate=float(config.rl.lr), steps_per_generation=1,
            num_iterations=1, shuffle_dataset=False, disable_dropout=True, bf16=False,
            generation_kwargs={"min_new_tokens": completion_len}, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                              callbacks=[Timer()])
        trainer.train()
        for rec in trainer.state.log_history:
            if "completions/mean_length" in rec:
                gen_tokens.append(rec["completions/mean_length"])
    timed = times[1:]  # the first step is the warm-up
    return {"total_s": float(np.mean(timed)), "prompt_len_mean": float(np.mean(prompt_lens)),
            "completion_len_mean": float(np.mean(gen_tokens[1:] or gen_tokens)) if gen_tokens else float("nan"),
            "threads": float(torch.get_num_threads())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="config file (default: configs/<shape>.py)")
    p.add_argument("--shape", choices=SHAPES, default="tiny", help="model shape: tiny (vs TRL) or a recipe (ours only)")
    p.add_argument("--device", choices=("any", "cpu", "gpu", "tpu"), default="any",
                   help="require this JAX backend (exit 2 otherwise): --device gpu on a lent GPU")
    p.add_argument("--dry-run", action="store_true", help="the shape's path at a tiny width/depth (CPU check)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--attention", choices=("xla", "cudnn", "splash"), default=None, help="model.attention_impl (default: the config's)")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    from mpa_jax import tokenizer as tk
    from mpa_jax.config import load_config_file

    backend = jax.default_backend()
    if args.device != "any" and backend != args.device:
        print(f"--device {args.device}: JAX's backend is {backend} ({jax.devices()[0].device_kind})", file=sys.stderr)
        return 2
    config = load_config_file(args.config) if args.config else shaped_config(args.shape, args.dry_run)
    if args.attention:
        config.model.attention_impl = args.attention
    tok = None
    if args.shape == "tiny":
        tok = tk.build_tokenizer(tk.synthetic_corpus(300), int(config.model.vocab_size), None)
        config.model.vocab_size = tok.vocab_size  # sampler and learner over the same ids (no padding rows)
    # Rows must hold prompt + completion; the budget at least one such row per device.
    need = 1 << (args.prompt_len + args.completion_len - 1).bit_length()
    config.rl.seq_len = max(int(config.rl.seq_len), need)
    config.rl.tokens_per_micro_batch = max(int(config.rl.tokens_per_micro_batch), int(config.rl.seq_len))
    prompts = _prompts(int(config.model.vocab_size), args.tasks, args.prompt_len)
    print(f"{backend} ({jax.devices()[0].device_kind} x {jax.device_count()}): model {config.model.num_hidden_layers} layers x "
          f"{config.model.hidden_size}, vocab {config.model.vocab_size}, compute {config.model.compute_dtype}; "
          f"{args.tasks} prompts x {args.group} completions, prompt {args.prompt_len} + completion {args.completion_len} tokens")
    ours = bench_ours(config, prompts, args.group, args.completion_len, args.iters)
    print("ours: " + "  ".join(f"{k} {v:.3f}" for k, v in ours.items()), flush=True)
    parts = {k: ours[k] for k in ("generate_s", "train_host_s", "train_device_s", "sync_s")}
    print("where the time goes: " + ", ".join(f"{k[:-2]} {100 * v / ours['total_s']:.0f}%" for k, v in parts.items())
          + f" of {ours['total_s']:.2f} s per iteration (first iteration, compiling: {ours['first_s']:.1f} s)")
    if args.skip_trl or args.shape != "tiny":
        return 0
    with tempfile.TemporaryDirectory() as d:
        tok.save(d) if hasattr(tok, "save") else tok.save_pretrained(d)
        trl_res = bench_trl(config, prompts, args.group, args.completion_len, args.iters, d)
    print("trl GRPOTrainer: " + "  ".join(f"{k} {v:.3f}" for k, v in trl_res.items()))
    print(f"ratio (TRL s / ours s per iteration): {trl_res['total_s'] / ours['total_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
