"""The embedded JAX engine: one engine over decode slots, for the agent loop, RL, evaluation and `mpa serve`.

`Engine` keeps a fixed number of decode *slots* (`rollout.slots`: rows of ring KV caches and recurrent
states, written through the model family's `decode_slots`, so every family runs here). Requests are
submitted one by one (`submit(prompt_ids, params, seed) -> Future[GenerateResult]`, optionally with a
per-chunk `on_update` stream) and join the running batch at the next decode chunk; a request that
finishes frees its slot for the next one at once. That is what lets the agent loop submit an
episode's next turn as soon as its feedback is ready instead of waiting for a round, and what the
server streams from. The batch `generate` / `generate_rows` of the RolloutEngine protocol are thin
wrappers: submit every prompt, wait for all.

Randomness: row `b` draws token `t` from `fold_in(key(seed_b), t)`, so a request's output depends only
on its prompt, its seed, its settings and the weights, not on what else runs (up to float rounding
between batch shapes): `generate` gives the same tokens and log-probs (to ~1e-5) as the whole-batch
program.

`generate_batch` is that whole-batch program (what `generate` was before the slot loop): bucketed
prefill + a jitted `lax.while_loop` decode per batch, one compiled program per shape bucket `(batch,
prompt_len, new_tokens)` (powers of two) and per static sampling path; every numeric sampling knob is a
traced argument. The slot loop runs requests too long for a slot through it, between chunks.

Weights: `update_weights(params | hf_dir, version)` copies the weights into the engine's own buffers
(callers never copy; the learner may donate its own afterwards) and swaps them in between decode chunks;
every result names the weight version(s) its tokens came from.

Placement. Without a mesh, `replicas=R` keeps a full copy of the weights on each of R local devices
(`replica_mesh`) and splits the slots over them; every program runs per replica under `shard_map` (one
compiled program, no communication). On a CPU host with one XLA host device per core
(`--xla_force_host_platform_device_count`) this is how the engine uses more than one core: XLA:CPU does
not split a small decode step usefully over threads (docs/perf.md). With a mesh, the parameters live in
their rule-given shardings (`param_sharding`) and XLA partitions the programs.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout import sampling
from mpa_jax.rollout.slots import CompileCounter, GenerationFuture, SlotDecoder, SlotLoop, SlotRequest, counting
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams, Update

__all__ = ["Engine", "JaxEngine", "check_vocab_limit"]

DEFAULT_SLOT_LEN = 4096  # tokens per slot when not given (capped at the model's max positions)


def _bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _tree_signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def check_vocab_limit(vocab_limit: int | None, model_vocab: int) -> None:
    """Raise EngineError unless `vocab_limit` (the tokenizer's size) fits the model's embedding rows."""
    if vocab_limit is None:
        return
    if isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int) or vocab_limit < 1:
        raise EngineError(f"vocab_limit must be a positive int (the tokenizer's size), got {vocab_limit!r}")
    if vocab_limit > model_vocab:
        raise EngineError(
            f"the tokenizer has {vocab_limit} ids but the model's embedding has only {model_vocab} rows;"
            " the tokenizer and the checkpoint must come from the same run"
        )


class Engine:
    """The embedded engine (`RolloutEngine` + `submit`) running a `mpa_jax.models` model in-process.

    Args:
      model_cfg: the model config (family, shapes, compute dtype).
      params: the parameter pytree (as from `models.init_params` / `models.from_pretrained`); copied.
      slots: decode slots (rows decoding at once; default `max_batch`); rounded up to a power of two
        per replica.
      slot_len: ring columns per slot: prompt bucket + max_new_tokens of the longest request that
        runs in a slot (longer ones run through `generate_batch`). Default 4,096; at most the max positions;
        a chunk attends only over the columns its rows hold, so a long ring costs memory, not steps.
      chunk: decode steps between admissions (and stream updates); `long_chunk` (default 4 x chunk)
        for a lone request.
      replicas: without a mesh, local devices each holding a copy of the weights and a share of the
        slots (see the module docstring); must be 1 with a mesh.
      mesh, rules: optional device mesh and logical-axis rules; parameters are placed accordingly.
      vocab_limit: ids >= vocab_limit are never sampled (their logits are -inf in every path, greedy
        and sampled): the tokenizer's size when the embedding is padded past it. None: the model's
        whole vocabulary. Learner log-probs must use the same limit (`chunked_logprobs(vocab_limit=)`).
      weight_version: label reported with every result until the next `update_weights`.
      max_batch: rows per compiled program of `generate_batch` (larger requests run in chunks).
      min_prompt_bucket, min_new_bucket: smallest shape buckets (fewer tiny compilations).
      max_prefill: prompts per replica in one slot prefill call.
      prefill_step, prefill_row_base: slot prefill shape buckets: widths are powers of two up to
        `prefill_step`, then multiples of it; rows are powers of `prefill_row_base` (2 or 4) up to
        `max_prefill`. Larger values: fewer compiled prefill programs, more padding.
      idle_exit_s: the slot loop's thread ends after this long without work (and restarts on demand).
    """

    def __init__(
        self,
        model_cfg: models.ModelConfig,
        params: Any,
        *,
        slots: int | None = None,
        slot_len: int | None = None,
        chunk: int = 8,
        long_chunk: int | None = None,
        replicas: int = 1,
        mesh: jax.sharding.Mesh | None = None,
        rules: Any = None,
        vocab_limit: int | None = None,
        weight_version: str = "0",
        cache_dtype: str | None = None,
        max_batch: int = 16,
        min_prompt_bucket: int = 16,
        min_new_bucket: int = 16,
        max_prefill: int = 16,
        prefill_step: int = 256,
        prefill_row_base: int = 2,
        idle_exit_s: float = 2.0,
    ) -> None:
        cfg = model_cfg
        check_vocab_limit(vocab_limit, cfg.vocab_size)
        if max_batch < 1:
            raise ValueError(f"Engine: max_batch must be >= 1, got {max_batch}")
        if replicas < 1 or (mesh is not None and replicas != 1):
            raise ValueError(f"Engine: replicas must be >= 1, and 1 with a mesh; got {replicas}")
        if replicas > jax.local_device_count():
            raise ValueError(f"Engine: replicas={replicas} but only {jax.local_device_count()} local devices")
        self._cfg = cfg
        self._mesh = mesh
        self._rules = rules
        self.min_prompt_bucket = min_prompt_bucket
        self.min_new_bucket = min_new_bucket
        self.cache_dtype = cache_dtype
        self._replicas = int(replicas)
        self._vocab_limit = int(vocab_limit) if vocab_limit is not None else int(cfg.vocab_size)
        self._data_size = replicas
        self._param_shardings: Any = None
        self._replica_mesh = None
        if mesh is not None:
            from mpa_jax import sharding

            self._param_shardings = sharding.param_shardings(cfg, mesh, rules)
            self._data_size = int(np.prod([mesh.shape[a] for a in ("data", "fsdp") if a in mesh.shape]))
        elif replicas > 1:
            from jax.sharding import NamedSharding, PartitionSpec

            self._replica_mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:replicas]), ("replica",))
            self._param_shardings = NamedSharding(self._replica_mesh, PartitionSpec())
        else:
            self._param_shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        # Batch buckets of `generate_batch` must split evenly over the data-parallel devices.
        self.max_batch = _bucket(max(max_batch, self._data_size), self._data_size)
        self._slot_cfg = {"slots": int(slots) if slots is not None else int(max_batch),
                          "max_len": min(int(slot_len) if slot_len is not None else DEFAULT_SLOT_LEN, cfg.max_position_embeddings),
                          "chunk": int(chunk), "long_chunk": long_chunk, "max_prefill": int(max_prefill),
                          "prefill_step": int(prefill_step), "prefill_row_base": int(prefill_row_base)}
        self.idle_exit_s = float(idle_exit_s)
        self._signature = _tree_signature(params)
        self._weights = (self._own(params), str(weight_version))  # swapped as one tuple: params and label agree
        self._loop: SlotLoop | None = None
        self._build = threading.Lock()  # guards creating / replacing the slot loop
        self._batch_compiles = CompileCounter()
        self._slot_compiles = CompileCounter()
        self.device_s = 0.0  # wall time inside generate / generate_batch (rollout cost accounting)

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "float32", mesh: Any = None, rules: Any = None, **kw: Any) -> "Engine":
        """Engine over an exported Hugging Face checkpoint directory (weight version: the directory name)."""
        model = models.from_pretrained(path, dtype=dtype, mesh=mesh, rules=rules)
        kw.setdefault("weight_version", os.path.basename(os.path.normpath(path)))
        return cls(model.cfg, model.params, mesh=mesh, rules=rules, **kw)

    # ---- what callers need to know ---------------------------------------------------------------

    @property
    def cfg(self) -> models.ModelConfig:
        """The model config."""
        return self._cfg

    model_cfg = cfg

    @property
    def params(self) -> Any:
        """The engine's own copy of the weights (placed; read-only for callers)."""
        return self._weights[0]

    @property
    def weight_version(self) -> str:
        """The label of the weights that the next decode chunk uses."""
        return self._weights[1]

    @property
    def vocab_limit(self) -> int:
        """Ids sampled are below this (the tokenizer's size; the model's vocabulary when not given)."""
        return self._vocab_limit

    @property
    def max_positions(self) -> int:
        """Longest prompt + new tokens a request may have (the model's max position embeddings)."""
        return int(self._cfg.max_position_embeddings)

    @property
    def replicas(self) -> int:
        """Weight copies decoding their share of the slots (1 with a mesh)."""
        return self._replicas

    @property
    def replica_mesh(self) -> jax.sharding.Mesh | None:
        """The ("replica",) mesh of the weight copies (None: one copy, or a sharding mesh)."""
        return self._replica_mesh

    @property
    def mesh(self) -> jax.sharding.Mesh | None:
        """The sharding mesh the weights are placed on by `rules` (None: replicas or one device)."""
        return self._mesh

    @property
    def rules(self) -> Any:
        return self._rules

    @property
    def param_sharding(self) -> Any:
        """Where the weights live: the rule-given sharding tree (mesh), or one sharding for every leaf
        (replicated over `replica_mesh`, or a single device)."""
        return self._param_shardings

    @property
    def slots(self) -> int:
        """Decode slots (rows decoding at once)."""
        return self._slot_loop().dec.slots

    @property
    def slot_len(self) -> int:
        """Ring columns per slot (longer requests run through `generate_batch`)."""
        return self._slot_loop().dec.max_len

    @property
    def compiles(self) -> int:
        """XLA compilations this engine's programs needed so far (counted events)."""
        return self._batch_compiles.n + self._slot_compiles.n

    @property
    def busy(self) -> bool:
        """Whether requests are queued or running."""
        return self._loop is not None and not self._loop.idle

    def stats(self) -> dict[str, float]:
        """Slot-loop counters: requests admitted / fallen back to the whole-batch program / stopped,
        prefill and chunk calls, weight updates waiting at a chunk boundary (`pausers`), seconds by phase, and decode-slot utilisation (`SlotLoop.utilisation`)."""
        loop = self._loop
        if loop is None:
            return {}
        out = {"admitted": float(loop.admitted), "finished": float(loop.finished), "fallback_rows": float(loop.fallback_rows),
               "cancelled_rows": float(loop.cancelled_rows), "prefills": float(loop.dec.prefills), "chunks": float(loop.dec.steps),
               "loop_thread": float(loop.thread_alive), "pausers": float(loop.pausers),
               **{f"{k}_s": v for k, v in loop.seconds.items()}}
        out.update(loop.utilisation())
        return out

    # ---- weights ---------------------------------------------------------------------------------

    def _own(self, params: Any) -> Any:
        """`params` in fresh buffers of the engine's placement: a caller may donate or change its own
        arrays afterwards (the learner's train step donates its state).

        Every leaf is copied first: on CPU `device_put` of a numpy array may alias its memory whatever
        `may_alias` says, `jax.device_get` of a CPU array is itself a view of the device buffer, and a device
        array already on the target placement can come back as the same buffer."""
        fresh = jax.tree.map(lambda x: np.array(x, copy=True) if isinstance(x, np.ndarray) else jnp.array(x, copy=True), params)
        return jax.device_put(fresh, self._param_shardings, may_alias=False)

    def update_weights(self, source: Any, version: str) -> None:
        """Swap in new weights: a params pytree (copied; any placement) or an exported HF checkpoint dir.

        Same structure, shapes and dtypes as before (no recompilation). The swap happens between decode
        chunks: requests admitted after this returns use only the new weights; a request running now
        continues under them from its next chunk (its result's `weight_versions` lists both).
        """
        if isinstance(source, (str, os.PathLike)):
            model = models.from_pretrained(os.fspath(source), dtype=self._cfg.param_dtype, mesh=self._mesh, rules=self._rules)
            if model.cfg.replace(extra={}) != self._cfg.replace(extra={}):
                raise EngineError(f"checkpoint {os.fspath(source)} has a different model config than the engine")
            params = model.params
        else:
            params = source
        if _tree_signature(params) != self._signature:
            raise EngineError("update_weights: new params differ in structure, shape or dtype from the engine's")
        placed = self._own(params)  # copied outside the loop's pause: decoding goes on meanwhile
        with self._build:  # no slot loop is built or replaced meanwhile (it would start from the old weights)
            loop = self._loop
            if loop is None:
                self._weights = (placed, str(version))
                return
            with loop.paused():
                self._weights = (placed, str(version))
                loop.dec.set_weights(placed, str(version))

    # ---- slots -------------------------------------------------------------------------------------

    def configure_slots(self, *, slots: int | None = None, slot_len: int | None = None, chunk: int | None = None,
                        long_chunk: int | None = None) -> None:
        """Change the slot layout (the server sizes it from `config.serve`); only while idle."""
        new = dict(self._slot_cfg)
        for key, value in (("slots", slots), ("max_len", slot_len), ("chunk", chunk), ("long_chunk", long_chunk)):
            if value is not None:
                new[key] = int(value)
        if new == self._slot_cfg:
            return
        with self._build:
            if self._loop is not None:
                if not self._loop.idle:
                    raise EngineError("configure_slots: requests are running")
                self._loop.close()
                self._loop = None
            self._slot_cfg = new

    def _slot_loop(self) -> SlotLoop:
        """The slot loop, built on first use (its caches are allocated then)."""
        loop = self._loop
        if loop is not None:
            return loop
        with self._build:
            if self._loop is None:
                c = self._slot_cfg
                dec = SlotDecoder(self._cfg, slots=c["slots"], max_len=c["max_len"], chunk=c["chunk"], long_chunk=c["long_chunk"],
                                  vocab_limit=self._vocab_limit, cache_dtype=self.cache_dtype, replica_mesh=self._replica_mesh,
                                  mesh=self._mesh, min_prompt_bucket=self.min_prompt_bucket, max_prefill=c["max_prefill"],
                                  prefill_step=c["prefill_step"], prefill_row_base=c["prefill_row_base"])
                params, version = self._weights
                with counting(self._slot_compiles):
                    dec.set_weights(params, version)
                self._loop = SlotLoop(dec, fallback=self._fallback, idle_exit_s=self.idle_exit_s, compiles=self._slot_compiles)
            return self._loop

    def _fallback(self, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int],
                  top_logprobs: int) -> list[GenerateResult]:
        """Requests too long for a slot: the whole-batch program (on the loop's thread, between chunks)."""
        return self._batch_rows(prompts, params, seeds, top_logprobs)

    def warmup(self, prompt_len: int, max_new: int, greedy: bool = False, filtered: bool = False, n_top: int = 0) -> int:
        """Compile the slot programs a load of `prompt_len`-token prompts and `max_new` new tokens uses
        (benches: compiles out of the timings). Only while idle; returns the chunk programs run."""
        loop = self._slot_loop()
        with loop.paused(), counting(self._slot_compiles):
            if not loop.idle:
                raise EngineError("warmup: requests are running")
            return loop.dec.warmup(prompt_len, max_new, greedy=greedy, filtered=filtered, n_top=n_top)

    def as_rounds(self) -> "RoundsView":
        """This engine without `submit`: an episode runner then schedules rounds of `generate` (each a batch
        on an idle engine, bitwise reproducible: what an exactly resumable RL run needs) instead of
        submitting each turn when it is ready (faster, but float rounding then depends on what else
        runs, ~1e-7 on log-probs)."""
        return RoundsView(self)

    def close(self) -> None:
        """Stop the slot loop's thread and free its caches (a later request builds them again)."""
        with self._build:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    # ---- generation ------------------------------------------------------------------------------

    def _check(self, i: int, prompt: list[int], sp: SamplingParams) -> None:
        vocab = self._cfg.vocab_size
        if not prompt:
            raise ValueError(f"generate: prompt {i} is empty")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"generate: prompt {i} has a token id outside [0, {vocab})")
        if len(prompt) + sp.max_new_tokens > self.max_positions:
            raise ValueError(
                f"generate: prompt {i} ({len(prompt)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds"
                f" max_position_embeddings ({self.max_positions})"
            )
        for t in sp.stop_token_ids:
            if not 0 <= t < vocab:
                raise ValueError(f"generate: stop token id {t} outside [0, {vocab})")

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        *,
        top_logprobs: int = 0,
        on_update: Callable[[Update], None] | None = None,
        updates: bool = True,
    ) -> GenerationFuture:
        """Queue one request; it joins the running batch at the next decode chunk.

        Returns a `concurrent.futures.Future` of its `GenerateResult` (`cancel()` while it waits, `stop()`
        while it runs). `seed` defaults to `params.seed`. `on_update(Update)` (optional) is called on
        the engine's thread with the new tokens after every chunk (when `updates`) and once with the
        result: a stream for the server. It must not block or call back into the engine's waits.
        `top_logprobs` > 0 also returns, per sampled token, that many most likely ids and their
        log-probs. Bad inputs raise ValueError here, in the caller's thread.
        """
        return self.submit_many([prompt_ids], [params], [params.seed if seed is None else seed], top_logprobs=top_logprobs,
                                on_update=None if on_update is None else [on_update], updates=updates)[0]

    def submit_many(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        *,
        top_logprobs: int = 0,
        on_update: Sequence[Callable[[Update], None] | None] | None = None,
        updates: bool = True,
    ) -> list[GenerationFuture]:
        """`submit` for several requests at once: they reach the slots at the same chunk boundary, in
        order (on an idle engine a batch then runs the same way every time: bitwise the same results
        for the same inputs, whatever ran before). Every input is checked before any is queued."""
        prompts, params, seeds = self._rows(prompts, params, seeds, top_logprobs)
        callbacks = list(on_update) if on_update is not None else [None] * len(prompts)
        if len(callbacks) != len(prompts):
            raise ValueError(f"submit_many: {len(callbacks)} callbacks for {len(prompts)} prompts")
        reqs = [SlotRequest(p, sp, s, int(top_logprobs), cb, updates) for p, sp, s, cb in zip(prompts, params, seeds, callbacks)]
        futures = [GenerationFuture(r) for r in reqs]
        self._slot_loop().submit_all(reqs)
        return futures

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerateResult]:
        """Continue every prompt (results in prompt order): `submit` each, wait for all."""
        return self.generate_rows(prompts, [params] * len(prompts), seeds)

    def generate_rows(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        seeds: Sequence[int] | None = None,
        top_logprobs: int = 0,
    ) -> list[GenerateResult]:
        """`generate` with sampling settings per prompt (any mix of temperatures, filters, lengths and
        stop ids). `top_logprobs` > 0 also returns, per sampled token, that many most likely ids and
        their log-probs (`GenerateResult.top_logprobs`). Row `i` uses `seeds[i]`, else
        `params[i].seed + i`.
        """
        params = list(params)
        row_seeds = list(seeds) if seeds is not None else [sp.seed + i for i, sp in enumerate(params)]
        t0 = time.perf_counter()
        futures = self.submit_many(prompts, params, row_seeds, top_logprobs=top_logprobs)
        try:
            return [f.result() for f in futures]
        finally:
            self.device_s += time.perf_counter() - t0

    def _rows(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], seeds: Sequence[int] | None,
              top_logprobs: int) -> tuple[list[list[int]], list[SamplingParams], list[int]]:
        """Checked inputs of a batch call (every row checked before any starts) and the row seeds."""
        prompts = [list(map(int, p)) for p in prompts]
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"generate: {len(params)} sampling settings for {len(prompts)} prompts")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        if not 0 <= int(top_logprobs) <= 64:
            raise ValueError(f"generate: top_logprobs must be in [0, 64], got {top_logprobs}")
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self._check(i, p, sp)
        row_seeds = [int(s) for s in seeds] if seeds is not None else [sp.seed + i for i, sp in enumerate(params)]
        return prompts, params, row_seeds

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        seeds: Sequence[int] | None = None,
        top_logprobs: int = 0,
    ) -> list[GenerateResult]:
        """The whole-batch program (one setting, or one per prompt): every prompt prefilled and decoded
        to the end in one compiled call per `max_batch` rows (prompts sorted by length first, so each
        call pads little). Same tokens as `generate`; no admission while it runs."""
        rows = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        prompts, rows, row_seeds = self._rows(prompts, rows, seeds, top_logprobs)
        t0 = time.perf_counter()
        try:
            return self._batch_rows(prompts, rows, row_seeds, int(top_logprobs))
        finally:
            self.device_s += time.perf_counter() - t0

    def _batch_rows(self, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int],
                    top_logprobs: int) -> list[GenerateResult]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[GenerateResult | None] = [None] * len(prompts)
        weights, version = self._weights
        with counting(self._batch_compiles):
            for lo in range(0, len(order), self.max_batch):
                idx = order[lo : lo + self.max_batch]
                chunk = self._batch_chunk(weights, version, [prompts[i] for i in idx], [params[i] for i in idx],
                                          [seeds[i] for i in idx], top_logprobs)
                for i, r in zip(idx, chunk):
                    results[i] = r
        return [r for r in results if r is not None]

    def _batch_chunk(self, weights: Any, version: str, prompts: list[list[int]], params: list[SamplingParams],
                     seeds: list[int], top_logprobs: int = 0) -> list[GenerateResult]:
        n = len(prompts)
        d = self._data_size
        b = -(-_bucket(n, 1) // d) * d  # a power of two, rounded up to split evenly over the data axes
        p_len = _bucket(max(len(p) for p in prompts), self.min_prompt_bucket)
        n_new = _bucket(max(sp.max_new_tokens for sp in params), self.min_new_bucket)
        ids = np.zeros((b, p_len), np.int32)
        mask = np.zeros((b, p_len), np.int32)
        for r, p in enumerate(prompts):
            ids[r, p_len - len(p) :] = p
            mask[r, p_len - len(p) :] = 1
        active = np.zeros((b,), bool)
        active[:n] = True
        mask[n:, -1] = 1  # filler rows: one real token so their attention is well defined
        seed_arr = np.zeros((b,), np.uint32)
        seed_arr[:n] = np.asarray(seeds, np.int64) % (2**32)
        n_stop = _bucket(max(len(sp.stop_token_ids) for sp in params), 4)
        stops = np.full((b, n_stop), -1, np.int32)
        max_new = np.ones((b,), np.int32)
        temperature = np.zeros((b,), np.float32)
        top_k = np.full((b,), -1, np.int32)
        top_p = np.ones((b,), np.float32)
        for r, sp in enumerate(params):
            stops[r, : len(sp.stop_token_ids)] = sp.stop_token_ids
            max_new[r] = sp.max_new_tokens
            temperature[r] = sp.temperature
            top_k[r] = sp.top_k
            top_p[r] = sp.top_p
        greedy = all(sp.greedy for sp in params)
        mixed = not greedy and any(sp.greedy for sp in params)
        filtered = not greedy and any(sp.filtered and not sp.greedy for sp in params)
        n_top = _bucket(top_logprobs, 1) if top_logprobs > 0 else 0
        inputs = self._shard_batch((ids, mask, active, seed_arr, max_new, temperature, top_k, top_p, stops))
        program = _jitted_generate(self._cfg, n_new, greedy, filtered, self.cache_dtype, self._replica_mesh, self._vocab_limit,
                                   mixed, n_top)
        outs = program(weights, *inputs)
        tokens, lps, n_gen, stopped = jax.device_get(outs[:4])
        tops = jax.device_get(outs[4:]) if n_top else None
        out = []
        for r in range(n):
            k = int(n_gen[r])
            toks = [int(t) for t in tokens[r, :k]]
            is_stop = bool(stopped[r])
            top = None
            if tops is not None:
                top = [[(int(i), float(v)) for i, v in zip(tops[0][r, j, :top_logprobs], tops[1][r, j, :top_logprobs])]
                       for j in range(k)]
            out.append(GenerateResult(token_ids=toks, logprobs=[float(x) for x in lps[r, :k]],
                                      finish_reason="stop" if is_stop else "length", matched_stop=toks[-1] if is_stop else None,
                                      prompt_tokens=len(prompts[r]), weight_version=version, top_logprobs=top))
        return out

    def _shard_batch(self, arrays: tuple) -> tuple:
        if self._mesh is None and self._replica_mesh is None:
            return tuple(jnp.asarray(a) for a in arrays)
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = self._mesh if self._mesh is not None else self._replica_mesh
        axes = tuple(a for a in ("data", "fsdp", "replica") if a in mesh.shape)
        out = []
        for a in arrays:
            spec = PartitionSpec(axes, *([None] * (a.ndim - 1)))
            out.append(jax.device_put(a, NamedSharding(mesh, spec)))
        return tuple(out)


class RoundsView:
    """`Engine.as_rounds()`: the RolloutEngine protocol of an engine (generate, generate_rows,
    update_weights, weight_version, vocab_limit, max_positions, cfg), without `submit`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    cfg = property(lambda self: self.engine.cfg)
    params = property(lambda self: self.engine.params)
    weight_version = property(lambda self: self.engine.weight_version)
    vocab_limit = property(lambda self: self.engine.vocab_limit)
    max_positions = property(lambda self: self.engine.max_positions)
    device_s = property(lambda self: self.engine.device_s)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None) -> list[GenerateResult]:
        return self.engine.generate(prompts, params, seeds)

    def generate_rows(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], seeds: Sequence[int] | None = None,
                      top_logprobs: int = 0) -> list[GenerateResult]:
        return self.engine.generate_rows(prompts, params, seeds, top_logprobs)

    def update_weights(self, source: Any, version: str) -> None:
        self.engine.update_weights(source, version)


JaxEngine = Engine  # the name every caller used; same constructor (max_batch=, replicas=, ...) and methods


@functools.lru_cache(maxsize=None)
def _jitted_generate(
    cfg: models.ModelConfig,
    n_new: int,
    greedy: bool,
    filtered: bool,
    cache_dtype: str | None,
    replica_mesh: jax.sharding.Mesh | None = None,
    vocab_limit: int | None = None,
    mixed: bool = False,
    n_top: int = 0,
):
    """One jitted program per (model config, new-token bucket, sampling path, replica mesh, vocabulary
    limit, top log-probs), shared by every engine instance, so a new engine or new weights of the same
    architecture never recompile."""
    fn = functools.partial(_generate, cfg, n_new, greedy, filtered, cache_dtype, vocab_limit, mixed, n_top)
    if replica_mesh is not None:
        from jax.sharding import PartitionSpec as P

        rows, rep = P("replica"), P()
        fn = jax.shard_map(
            fn,
            mesh=replica_mesh,
            in_specs=(rep,) + (rows,) * 9,
            out_specs=(rows,) * (6 if n_top else 4),
            check_vma=False,  # no collectives inside: each device's loop is its own
        )
    return jax.jit(fn)


def _generate(
    cfg: models.ModelConfig,
    n_new: int,
    greedy: bool,
    filtered: bool,
    cache_dtype: str | None,
    vocab_limit: int | None,
    mixed: bool,
    n_top: int,
    params: Any,
    ids: jax.Array,
    mask: jax.Array,
    active: jax.Array,
    seeds: jax.Array,
    max_new: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    stops: jax.Array,
) -> tuple[jax.Array, ...]:
    """Prefill + decode loop. Sampling knobs, lengths and stop ids are per row ([B], stops [B, S]).
    Returns tokens [B, n_new], log-probs, tokens generated [B], stopped [B] (+ top ids and top
    log-probs [B, n_new, n_top] when n_top > 0)."""
    b, p_len = ids.shape
    params = models.decode_params(cfg, params)
    state = models.init_decode_state(cfg, b, p_len + n_new, cache_dtype)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
    # Prefill all but the last column; its logits are dead code and compiled away.
    _, state = models.decode(cfg, params, ids[:, :-1], positions[:, :-1], state, mask[:, :-1])
    keys = jax.vmap(jax.random.key)(seeds)
    last_pos = positions[:, -1]
    ones = jnp.ones((b, 1), jnp.int32)
    logits, state = models.decode(cfg, params, ids[:, -1:], last_pos[:, None], state, ones)
    max_new = jnp.where(active, max_new, 0)
    longest = jnp.max(max_new)

    def cond(carry):
        t, done = carry[0], carry[5]
        return (t < longest) & ~jnp.all(done)

    def body(carry):
        t, logits, state, out_tok, out_lp, done, n_gen, stopped, *tops = carry
        picked = sampling.sample_step(
            sampling.mask_vocab(logits[:, 0], vocab_limit), keys, t, temperature, top_k, top_p,
            greedy=greedy, filtered=filtered, mixed=mixed, n_top=n_top,
        )
        tok, lp = picked[0], picked[1]
        live = ~done
        tok = jnp.where(live, tok, 0)
        out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, t))
        out_lp = jax.lax.dynamic_update_slice(out_lp, jnp.where(live, lp, 0.0)[:, None], (0, t))
        if n_top:
            tops = [jax.lax.dynamic_update_slice(tops[0], picked[2][:, None], (0, t, 0)),
                    jax.lax.dynamic_update_slice(tops[1], picked[3][:, None], (0, t, 0))]
        n_gen = n_gen + live.astype(jnp.int32)
        hit = live & jnp.any(tok[:, None] == stops, axis=1)
        stopped = stopped | hit
        done = done | hit | (t + 1 >= max_new)
        step_mask = (~done).astype(jnp.int32)[:, None]  # finished rows' filler tokens are never attended
        logits, state = models.decode(cfg, params, tok[:, None], (last_pos + t + 1)[:, None], state, step_mask)
        return (t + 1, logits, state, out_tok, out_lp, done, n_gen, stopped, *tops)

    carry = (
        jnp.int32(0),
        logits,
        state,
        jnp.zeros((b, n_new), jnp.int32),
        jnp.zeros((b, n_new), jnp.float32),
        ~active,
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b,), bool),
    )
    if n_top:
        carry += (jnp.zeros((b, n_new, n_top), jnp.int32), jnp.zeros((b, n_new, n_top), jnp.float32))
    out = jax.lax.while_loop(cond, body, carry)
    return (out[3], out[4], out[6], out[7], *out[8:])
