"""Tiny config: the whole path on a laptop CPU in minutes; also the config tests use.

Sections: model, mesh/sharding, tokenizer, tasks, oracle, sft, checkpoint, rollout, serve, rl.
Every other config starts from this one and changes what differs.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "tiny"
    c.seed = 0

    # Model: Qwen3-family shapes, Hugging Face config.json names. `init_from` = an HF directory to load.
    c.model = ml_collections.ConfigDict()
    c.model.family = "qwen3"  # qwen3 | qwen3_5 | qwen3_5_moe
    c.model.init_from = ""
    c.model.vocab_size = 4096
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_hidden_layers = 2
    c.model.num_attention_heads = 4
    c.model.num_key_value_heads = 2
    c.model.head_dim = 32
    c.model.rope_theta = 1_000_000.0
    c.model.rms_norm_eps = 1e-6
    c.model.tie_word_embeddings = True
    c.model.max_position_embeddings = 4096
    c.model.param_dtype = "float32"  # master weights
    c.model.compute_dtype = "float32"  # bfloat16 on accelerators
    c.model.remat = "none"  # none | full | dots
    c.model.logprob_chunk = 1024  # vocabulary chunk for log-probs
    c.model.delta_impl = "jnp"  # Qwen3.5 gated delta rule: jnp (chunked) | pallas (GPU/TPU kernel)

    # Mesh (data, fsdp, tensor, expert); -1 takes the remaining devices. Logical-axis rules in MaxText style.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    c.mesh.expert = 1
    c.sharding_rules = (
        ("batch", ("data", "fsdp")),
        ("length", None),
        ("embed", "fsdp"),
        ("mlp", "tensor"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("head_dim", None),
        ("vocab", "tensor"),
        ("experts", "expert"),
    )

    # Tokenizer: an HF directory, or empty to build the project's own BPE into <workdir>/tokenizer.
    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.path = ""
    c.tokenizer.vocab_size = 4096
    c.tokenizer.corpus_tasks = 300  # envs tasks (oracle episodes) in the BPE corpus; 0 = synthetic text only

    # Tasks of the sandbox benchmark.
    c.tasks = ml_collections.ConfigDict()
    c.tasks.seed = 0  # shifts every split's instance-seed range (splits stay disjoint)
    c.tasks.per_template = 0  # 0 = the benchmark's default counts (test 4, dev 1, train 4 per template x weight)

    # Oracle demonstrations for the cold start.
    c.oracle = ml_collections.ConfigDict()
    c.oracle.split = "train"
    c.oracle.max_tasks = 400
    c.oracle.variants = 1

    # Supervised cold start.
    c.sft = ml_collections.ConfigDict()
    c.sft.data = ""  # trajectory JSONL (or .parquet with pyarrow); empty = `mpa sft` makes oracle trajectories first
    c.sft.seq_len = 2048  # packed row length; oracle episodes are ~1-2k tokens (tool schemas in the prompt)
    c.sft.batch_size = 8  # rows per optimizer step (global; a multiple of the data-parallel devices)
    c.sft.micro_batches = 1  # gradient accumulation (exact: token sums over micro-batches)
    c.sft.steps = 200  # ~5 min on 2 CPU cores; enough for well-formed tool calls on held-out tasks (docs/perf.md)
    c.sft.lr = 3e-3
    c.sft.lr_end_ratio = 0.1  # cosine decays to lr * this
    c.sft.warmup_steps = 6
    c.sft.weight_decay = 0.01
    c.sft.clip_norm = 1.0
    c.sft.b1 = 0.9
    c.sft.b2 = 0.95
    c.sft.log_every = 10
    c.sft.eval_every = 30
    c.sft.eval_batches = 2
    c.sft.eval_fraction = 0.05  # trajectories held out (seeded) for the held-out loss
    c.sft.only_success = True  # train only on verified-successful episodes (infra failures are always dropped)
    c.sft.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0 = by device kind (unknown on CPU)
    c.sft.export = False  # write <workdir>/hf (Hugging Face) at the end
    c.sft.export_dtype = "bfloat16"

    # Checkpoints.
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 30  # steps; the last step is always saved
    c.checkpoint.keep = 2
    c.checkpoint.async_save = True

    # Rollout (sampling and the agent loop).
    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # jax | sglang
    c.rollout.sglang_url = "http://127.0.0.1:30000"
    c.rollout.split = "dev"
    c.rollout.max_tasks = 32
    c.rollout.batch_size = 32  # concurrent episodes
    c.rollout.max_turns = 8
    c.rollout.max_new_tokens = 128  # per turn; oracle turns are <= 100 tokens
    c.rollout.max_total_tokens = 4096
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    c.rollout.greedy_eval = True
    c.rollout.sharded = False  # place the embedded engine on `c.mesh` (accelerators); one device otherwise
    c.rollout.replicas = 0  # unsharded engine: weight copies decoding parts of each batch; 0 = one per CPU core

    # Serving.
    c.serve = ml_collections.ConfigDict()
    c.serve.host = "127.0.0.1"
    c.serve.port = 30000
    c.serve.max_batch = 8
    c.serve.max_new_tokens = 256  # default for chat completions without max_tokens

    # Scale settings (issue 17): scanned layers, accelerator attention, MoE aux loss in the SFT loss.
    c.model.scan_layers = False  # stacked layer params + one lax.scan (compile time independent of depth)
    c.model.attention_impl = "xla"  # xla | cudnn (GPU fused attention) | splash (TPU Pallas kernel)

    # CARE RL (next round); the keys are fixed here so that configs and overrides are stable.
    c.rl = ml_collections.ConfigDict()
    c.rl.group_size = 8
    c.rl.lambda_max = 0.0
    c.rl.c_lo = 0.3
    c.rl.c_hi = 0.8
    c.rl.beta = 0.0
    c.rl.clip_low = 0.2
    c.rl.clip_high = 0.28
    c.rl.kl_coef = 0.0
    return c
