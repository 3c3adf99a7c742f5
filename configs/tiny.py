"""Tiny config: the whole path on a laptop CPU in minutes; also the config tests use.

Sections: model, mesh/sharding, tokenizer, tasks, oracle, sft, checkpoint, rollout, serve, rl.
Every other config starts from this one and changes what differs.
"""
import ml_collections

from mpa_jax.logical_axes import DEFAULT_RULES


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
    c.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (mpa_jax/logical_axes.py)

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
    c.sft.max_bad_updates = 3  # steps in a row with a non-finite loss or gradient norm (skipped, weights kept) before SFT stops
    c.sft.only_success = True  # train only on verified-successful episodes (infra failures are always dropped)
    c.sft.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0 = by device kind (unknown on CPU)
    c.sft.export = False  # write <workdir>/hf (Hugging Face) at the end
    c.sft.export_dtype = "bfloat16"

    # Progress of long jobs (SFT, evaluation): a rich bar on a terminal, else a plain line every `every_s` seconds.
    c.progress = ml_collections.ConfigDict()
    c.progress.every_s = 30.0  # plain log lines (nohup, CI, a redirect): one per period
    c.progress.first_s = 5.0  # the first plain line comes this soon after the loop starts

    # Checkpoints.
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 30  # steps; the last step is always saved
    c.checkpoint.keep = 2
    c.checkpoint.async_save = True

    # Rollout (sampling and the agent loop).
    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # jax | sglang
    c.rollout.sglang_url = "http://127.0.0.1:30000"  # an SGLang server or sglang-router ("" with sglang_workers alone)
    c.rollout.sglang_workers = ()  # worker URLs: synced at every weight update; balanced by the client without a router
    c.rollout.sglang_timeout_s = 300.0  # per request
    c.rollout.sglang_max_retries = 3  # per request: transport errors, timeouts, 5xx (then the episode is infra)
    c.rollout.sglang_max_staleness = 0  # weight versions a result may lag the engine's (0: exactly the synced one)
    c.rollout.split = "dev"
    c.rollout.max_tasks = 32
    c.rollout.batch_size = 32  # concurrent episodes
    c.rollout.max_turns = 8
    c.rollout.max_new_tokens = 128  # per turn; oracle turns are <= 100 tokens
    c.rollout.max_total_tokens = 4096
    c.rollout.max_output_errors = 3  # malformed turns (error Feedback each) before an episode ends; 0 = no limit
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    c.rollout.greedy_eval = True
    # continuous: each episode's next turn goes to the embedded engine as soon as its feedback is ready (RL's
    # rollouts always run in rounds: bitwise reproducible batches for exact resume); rounds: one call per round
    c.rollout.schedule = "continuous"
    c.rollout.sharded = False  # place the embedded engine on `c.mesh` (accelerators); one device otherwise
    c.rollout.replicas = 0  # unsharded engine: weight copies decoding parts of each batch; 0 = one per CPU core
    # Prompts are prefilled in chunks of prefill_chunk tokens per row (one compiled program whatever the prompt
    # lengths; docs/perf.md). prefix_cache: an episode's next turn, a group's samples and a common system prompt
    # reuse the keys/values the engine's slot rows already hold (False: every prompt prefilled whole).
    c.rollout.prefill_chunk = 256
    c.rollout.prefix_cache = True
    # The embedded engine's compute dtype: "" = the model's (model.compute_dtype). On a CPU host "float32" decodes
    # ~2.8x faster than bfloat16 (docs/perf.md); the learner keeps model.compute_dtype either way.
    c.rollout.compute_dtype = ""
    # Keep compiled engine programs under <workdir>/xla_cache when make_engine knows the run's workdir (RL).
    c.rollout.compilation_cache = True

    # Serving.
    c.serve = ml_collections.ConfigDict()
    c.serve.host = "127.0.0.1"
    c.serve.port = 30000
    c.serve.max_batch = 8
    c.serve.max_new_tokens = 256  # default for chat completions without max_tokens
    c.serve.batcher = "auto"  # auto | slots (admission per decode chunk) | call (per whole engine call)
    c.serve.slot_len = 2048  # tokens per slot (prompt bucket + max_tokens); longer requests run as engine calls
    c.serve.slot_chunk = 8  # decode steps between admissions / stream updates (a lone request: 4x; docs/perf.md)
    # Auth and limits (docs/serving.md). api_key "": none (--api-key and $MPA_API_KEY take precedence).
    c.serve.api_key = ""
    c.serve.max_body_bytes = 8 * 1024 * 1024  # larger bodies: 413 before they are read
    c.serve.max_prompt_chars = 1_000_000  # text of a request's prompt (messages + tools): 400 above, before tokenizing
    c.serve.max_prompt_tokens = 131_072  # rendered prompt tokens: 400 above (the model's context is checked too)
    c.serve.max_concurrent_requests = 64  # generation requests answered at once (rows beyond max_batch wait in the batcher)
    c.serve.max_queued_requests = 256  # waiting for a turn (bodies not read yet); one more: 429

    # Planner context format (envs/context.py): "json" = tool schemas through the chat template (real
    # checkpoints); "compact" = one-line signatures in the system message (~3x fewer tokens per episode).
    # reasoning: the oracle's <think> text in demonstrations ("full") or none ("none").
    c.context = ml_collections.ConfigDict()
    c.context.format = "json"
    c.context.reasoning = "full"

    # Scale settings (issue 17): scanned layers, accelerator attention, MoE aux loss in the SFT loss.
    c.model.scan_layers = False  # stacked layer params + one lax.scan (compile time independent of depth)
    c.model.attention_impl = "xla"  # xla | cudnn (GPU fused attention) | splash (TPU Pallas kernel)

    # CARE RL (next round); the keys are fixed here so that configs and overrides are stable.
    c.rl = ml_collections.ConfigDict()
    c.rl.group_size = 8
    # CARE's length term (DESIGN §6): lambda 0 below competence c_lo, up to lambda_max at c_hi. The starter's
    # competence on train templates is ~0.5-0.8 (docs/experiments.md), so the demo's RL prices length at
    # lambda ~0.2-0.5 and moves with each key's competence; lambda_max 0 would make "CARE" vanilla.
    c.rl.lambda_max = 0.5
    c.rl.c_lo = 0.3
    c.rl.c_hi = 0.8
    c.rl.beta = 0.0  # ablation (off in CARE as designed): successes on hard keys amplified by 1 + beta (1 - c_k)
    c.rl.clip_low = 0.2
    c.rl.clip_high = 0.28
    c.rl.kl_coef = 0.0
    # RL trainer (issue 13): `mpa rl`; the maths is in mpa_jax/rl/care.py, the loss in rl/loss.py.
    c.rl.algo = "care"  # care | vanilla (plain group-relative RL: no cost, no calibration)
    c.rl.adv_clip = 5.0  # advantages are squashed into (-adv_clip, adv_clip) (tanh: keeps their order)
    c.rl.tool_call_cost = 10.0  # cost of a tool call, in output tokens
    c.rl.cost_sharpness = 1.0  # cost_hat = softsign(sharpness * z): > 1 prices a success a little above its peers' mean harder
    c.rl.failure_cost = 0.0  # ablation: > 0: in a group with a success, a failure pays up to this x lambda for its length (care.py)
    # competence c_k per template x difficulty, backed off to its cell and the global value (rl/competence.py)
    c.rl.competence_window = 64.0  # episodes an entry remembers: its tally decays by (1 - 1/window) per own episode
    c.rl.competence_prior = 4.0  # pseudo-episodes of the parent's value in each estimate (evidence weighting)
    c.rl.competence_init = 0.5  # the global value before any evidence (seeded by the data stage's probe where there is one)
    c.rl.steps = 20
    c.rl.tasks_per_step = 8
    c.rl.split = "train"  # a split, or a tasks JSONL (the loop's RL trains on its constructed tasks: loop.rl_tasks)
    c.rl.templates = ""  # comma-separated task templates to train on; empty = every template of the split
    c.rl.temperature = 1.0  # sampling temperature; learner log-probs use the same (SamplingParams.for_ratios)
    c.rl.ppo_epochs = 1
    c.rl.minibatches = 2  # optimizer updates per epoch (rollouts split into this many minibatches)
    c.rl.seq_len = 4096  # longest packed row (>= rollout.max_total_tokens so no episode is cut); rows are sized to
    # the step's longest episode (power of two, <= seq_len): compact episodes get 1,024-token rows
    c.rl.tokens_per_micro_batch = 4096  # per data-parallel device and micro-batch (>= seq_len): bounds the update's
    # memory whatever tasks_per_step x group_size; micro-batches (exact gradient accumulation) follow from it
    c.rl.optimizer = "adamw"  # adamw | sgd (momentum rl.b1)
    c.rl.negative_scale = 1.0  # factor on negative advantages (failed rollouts); 0 = learn from successes only
    c.rl.lr = 1e-4  # 1e-5 barely moves a 4.2M model trained at 2e-3 (the loop's rounds)
    c.rl.warmup_steps = 0
    c.rl.lr_end_ratio = 1.0  # constant learning rate by default
    c.rl.weight_decay = 0.0
    c.rl.clip_norm = 1.0
    c.rl.b1 = 0.9
    c.rl.b2 = 0.999
    c.rl.max_bad_updates = 3  # updates in a row with a non-finite loss or gradient norm (skipped) before RL stops
    # which tasks a step trains on: "cursor" = a seeded permutation of rl.split; "competence" = fresh instances of
    # train templates drawn by competence (most where it is intermediate), groups without reward variance re-drawn
    c.rl.selection = "cursor"
    # competence: at most tasks_per_step x this many groups drawn per step; the demo's budget allows 1 (fresh
    # instances by competence, unanimous groups left out, none re-drawn); configs/rl_lift.py uses 3
    c.rl.select_tries = 1
    c.rl.select_floor = 0.05  # competence: weight of templates at competence 0 or 1
    c.rl.select_worlds = 0  # competence: fresh instances in this many persona worlds of no split (0: the train split's six)
    c.rl.select_prior = ""  # competence: trajectories (JSONL or dir) whose outcomes seed the table (the data stage's probe)
    c.rl.simulated_tasks = 64  # training tasks of the simulated env when config.envs.mixture.simulated > 0
    c.rl.infra_retries = 2  # re-run an infra-failed episode this many times, then drop it (never rewarded)
    c.rl.async_rollouts = False  # True: step k+1 samples while step k trains (one weight version stale)
    c.rl.max_staleness = 1
    c.rl.checkpoint_every = 5  # RL steps
    c.rl.save_rollouts = True  # each step's rollouts to <workdir>/rollouts/step_N.jsonl (competence, failure mining)
    # `mpa experiment rl-lift` (mpa_jax/experiments/rl_lift.py): refresh_steps > 0 first SFTs the start on oracle
    # demonstrations of every train template in refresh_worlds persona worlds of no split (0 = RL from the start itself)
    c.lift = ml_collections.ConfigDict()
    c.lift.refresh_steps = 0
    c.lift.refresh_worlds = 1024
    c.lift.refresh_per_template = 4
    c.lift.refresh_lr = 1e-4

    # AI for Data (mpa_jax/data): construction, curation, feedback. (issue 18)
    c.data = ml_collections.ConfigDict()
    c.data.tasks_per_round = 400  # new gated train tasks constructed per round (weighted by competence; fresh instance seeds)
    c.data.policy_tasks = 16  # train tasks the current policy attempts per round (its verified successes join the data)
    c.data.teacher_url = ""  # OpenAI-compatible endpoint for teacher trajectories; empty = no teacher
    c.data.teacher_model = "teacher"
    c.data.teacher_tasks = 0
    c.data.paraphrase = False  # reword constructed instructions through the teacher endpoint (re-gated)
    c.data.max_tokens = 2048  # length cap (tokens per example)
    c.data.max_examples = 0  # budget per dataset; 0 = keep every curated example
    c.data.recovery_fraction = 0.2  # recovery traces mixed in up to this share of the dataset
    c.data.weight_floor = 0.05  # generation weight of cells with competence near 0 or 1

    # Evaluation (mpa eval): the held-out benchmark and the price table for cost per 1,000 tasks. (issue 18)
    c.eval = ml_collections.ConfigDict()
    c.eval.split = "test"
    c.eval.max_tasks = 32  # stratified over category x domain; 0 = the whole split
    c.eval.k = 1  # runs per task: 1 = one greedy run; k > 1 sampled runs (pass@1, pass^k)
    c.eval.prices = ml_collections.ConfigDict()
    c.eval.prices.input_per_mtok = 0.10  # per million input (prompt + tool) tokens
    c.eval.prices.output_per_mtok = 0.40  # per million output tokens
    c.eval.prices.per_tool_call = 0.0001
    c.eval.prices.per_device_second = 0.0005
    c.eval.prices.currency = "USD"

    # The closed loop (mpa loop). (issue 18)
    c.loop = ml_collections.ConfigDict()
    c.loop.rounds = 2
    # the start (`make demo`): the shipped starter planner (configs/starter.py, `mpa starter`) when built;
    # "" trains from scratch. `mpa loop --checkpoint PATH` names any other start.
    c.loop.starter = "starter"
    c.loop.refresh_steps = 40  # SFT steps per round on the curated data so far (0 = none); also the cold start's from a starter
    c.loop.refresh_lr = 1e-4  # fresh AdamW moments on a converged starter (it ended at 2e-4)
    c.loop.rl_steps = 2  # CARE RL steps per round (config.rl.* for the rest); 0 = no RL
    # RL tasks: "select" = competence-aware selection (rl.selection = "competence", seeded by the data stage's
    # probe: fresh instances of templates of intermediate competence, unanimous groups re-drawn); "data" = the
    # previous data stage's constructed tasks; "split" = config.rl.split (the starter's own training instances:
    # sampled success ~0.9, most groups all-success, so little signal)
    c.loop.rl_tasks = "select"
    # learner devices of the loop's SFT and RL stages (0 = config.mesh): on CPU one, since each of the 8 forced
    # host devices holds its own micro-batch at once (the tiny loop's first RL step passed 6 GB RSS on 8) and
    # they share the same two cores
    c.loop.learner_devices = 1
    # Every stage is evaluated on the same tasks of this split: eval_seen of templates seen in training and
    # eval_held_out of held-out templates (the demo's table); both 0 = config.eval.max_tasks stratified tasks.
    # "preregistered": the pre-registered test set (32 + 16 = its demo subset; docs/preregistered.md); dev is for tuning.
    c.loop.eval_split = "preregistered"
    c.loop.eval_seen = 32
    c.loop.eval_held_out = 16
    c.loop.release_gate_tasks = 24  # a released harness version must not lower success on this many train tasks (0 = no gate)
    c.loop.export_dtype = "bfloat16"

    # Prompt-injection defense (harness/security, docs/security.md): every env the runner makes is wrapped by GuardedEnv.
    c.security = ml_collections.ConfigDict()
    c.security.enabled = True
    c.security.defense = "policy"  # policy: data marking + sink policy (ours) | spotlight | pi_detector | tool_filter | none
    c.security.policy = ""  # a released policy (harness/security/policies); "" = by env kind (sandbox, agentdojo_<suite>)

    # Harness (DESIGN §5): the runtime between planner and env. enabled=False: raw planner + env (ablations).
    c.harness = ml_collections.ConfigDict()
    c.harness.enabled = False
    c.harness.tools = "task"  # task: the task's tool list | catalog: top-k of the whole catalog by retrieval
    c.harness.top_k = 8  # tools handed to the planner in catalog mode
    c.harness.normalise = True  # schema normalisers (types, enum case, whitespace) + approved argument rewrites
    # retrieve relevant skills into the system prompt: off for the tiny planners, which never saw skill text in
    # training (two retrieved skills took the demo's SFT planner from 58.3% to 35.4% on its 48 dev tasks,
    # docs/harness.md); the Qwen recipes turn it on
    c.harness.skills = False
    c.harness.skills_dir = ""  # extra skill files (the shipped ones in harness/skills/ are always read)
    c.harness.max_skills = 2
    c.harness.context_tokens = 3000  # budget for prior history in the first prompt (oldest turns dropped first)
    c.harness.subagents = False  # run `delegate` as a sub-agent planner call with the role's own context and tools
    c.harness.subagent_turns = 6
    c.harness.store = ""  # SQLite trace store (WAL); empty = traces are not recorded
    c.harness.root = "runs/harness"  # proposals and harness versions on disk (`mpa harness mine/review`)
    c.harness.version_dir = ""  # an approved harness version to run under (normalisers, skills, descriptions)
    # MCP servers to start over stdio: a list of entries, each "CMD ARGS" (split like a shell, never run
    # through one), optionally led by name=/prefix=/rename=old:new/allow=a,b, or a dict of those keys
    # (docs/harness.md); e.g. ["python3 -m mcp_server_time", "prefix=calc_ uvx mcp-server-calculator"]
    c.harness.mcp = []
    c.harness.mcp_allow = "*"  # comma-separated MCP tool names the planner may call ("*" = all)
    c.harness.mcp_timeout_s = 20.0  # start (handshake + tool listing) and each call
    c.harness.mcp_log = ""  # file the servers' stderr is appended to ("" = kept for error messages only)
    c.harness.max_result_chars = 16000  # a provider's answer beyond this is cut, with a marker and its sha256 (0 = no cap)
    c.harness.memory = False  # memory tools + memory context (harness/memory, issue 15) as a tool provider
    c.harness.memory_store = ""  # one persistent memory store for all episodes; empty = per-episode, from the task's history
    c.harness.memory_tokens = 512  # budget of the memory block in the system prompt
    c.harness.review = ml_collections.ConfigDict()
    # manual | auto (the version manifest says so): `mpa harness mine` and the loop's harness stage; the loop
    # runs unattended, so this CPU/demo config approves automatically (`--config.harness.review.policy=manual`)
    c.harness.review.policy = "auto"

    # Environments (issue 16): kwargs per env kind reach make_env(kind, config=c); `concurrency` and
    # `timeout_s` are the worker pool's per-kind limits; `mixture` weights the kinds' episodes.
    c.envs = ml_collections.ConfigDict()
    c.envs.kind = "sandbox"  # what `mpa oracle` / `mpa rollout` run on (--env)
    c.envs.mixture = ml_collections.ConfigDict({"sandbox": 1.0, "simulated": 0.0, "adb": 0.0})
    # sandbox calls are sub-ms CPU work: inline (concurrency 0) beats threads (bench/sandbox.py)
    c.envs.sandbox = ml_collections.ConfigDict({"fault_injection": True, "concurrency": 0, "timeout_s": 30.0})
    c.envs.simulated = ml_collections.ConfigDict({"backend": "deterministic", "max_retries": 2, "concurrency": 16,
                                                  "timeout_s": 120.0})
    c.envs.adb = ml_collections.ConfigDict({"device": "", "adb_port": 5037, "command_timeout_s": 10.0,
                                            "reconnect_attempts": 5, "concurrency": 1, "timeout_s": 60.0})
    # External benchmarks as env kinds (docs/benchmark.md). BFCL v4 multi-turn: splits by scenario (of 200:
    # test_scenarios test, dev_scenarios dev, the rest train; split_seed orders them); project_root is BFCL's
    # scratch folder (BFCL_PROJECT_ROOT; "" = <tmp>/mpa-bfcl). Its backends are in-process Python: inline.
    c.envs.bfcl = ml_collections.ConfigDict({"project_root": "", "split_seed": 0, "test_scenarios": 40,
                                             "dev_scenarios": 20, "concurrency": 0, "timeout_s": 60.0})
    # AgentDojo: its suites' user tasks, split per suite by user task (test_fraction test, dev_fraction dev).
    # attack: one of AgentDojo's attacks (envs/agentdojo/attacks.ATTACKS) adds the split's (user task x injection
    # task) pairs under it to the kind's tasks (reward: user goal done, attacker's not; docs/security.md); "" = none.
    # injection_tasks: only the first N injection tasks of each suite (0 = all; each pair loads its own world).
    c.envs.agentdojo = ml_collections.ConfigDict({"benchmark_version": "v1.2.2", "split_seed": 0, "test_fraction": 0.3,
                                                  "dev_fraction": 0.1, "attack": "", "injection_tasks": 0,
                                                  "concurrency": 0, "timeout_s": 60.0})
    # Long-history memory (harness/memory; `mpa memory suite|eval`).
    c.memory = ml_collections.ConfigDict()
    c.memory.seed = 0  # suite generator seed
    c.memory.persona_seed = 0  # the sandbox persona whose world the histories talk about
    c.memory.per_ability = 10  # questions per BEAM ability in a suite
    c.memory.paraphrase = 0.3  # share of update/instruction/preference questions worded unlike the history
    c.memory.budget_tokens = 2048  # context budget of memory and of the long-context baseline (ceil(chars/4))
    c.memory.reader = "scripted"  # scripted | openai | none (answer accuracy in `mpa memory eval`)
    c.memory.store = ml_collections.ConfigDict()
    c.memory.store.recency_weight = 0.3
    c.memory.store.entity_weight = 1.0
    c.memory.store.candidates = 64  # bm25 candidates re-ranked per query
    c.memory.store.min_coverage = 0.5  # abstain below this idf-weighted coverage (queries without known entities)
    c.memory.store.rank_limit = 500  # bm25-rank candidates up to this many matches; past it, the newest
    return c
