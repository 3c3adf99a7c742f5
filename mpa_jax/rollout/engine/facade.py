"""The engine facade: `Engine`, one embedded engine over decode slots for the agent loop, RL, evaluation
and `mpa serve`.

`Engine` keeps a fixed number of decode *slots* (`rollout.slots`: rows of KV caches and recurrent
states, `decoder.SlotDecoder`) driven by a host scheduler (`scheduler.SlotLoop`) with a prefix cache:
an episode's next turn continues from what its row already holds, a group's samples share their
prompt's prefill, and a prefix common to many requests is computed once (`GenerateResult.cached_tokens`
says how many prompt tokens a request reused; `stats()` has the totals). Prompts are prefilled in
fixed-size chunks (`prefill_chunk` tokens), so the compiled programs do not grow with the mix of prompt
lengths (`stats()["programs"]`). Requests are submitted one by one (`submit(prompt_ids, params, seed) ->
Future[GenerateResult]`, optionally with a per-chunk `on_update` stream) and join the running batch at
the next decode chunk. `generate` / `generate_rows` (the RolloutEngine protocol) submit every prompt and
wait for all; `generate_batch` is the same with the prefix cache off for those rows (the reference of
the parity tests and benches).

Randomness: row `b` draws token `t` from `fold_in(key(seed_b), t)`, so a request's output depends only
on its prompt, its seed, its settings and the weights, not on what else runs or what was reused (up to
float rounding between shapes).

Weights: `update_weights(params | hf_dir, version)` copies the weights into the engine's own buffers and
swaps them in between decode chunks; every cached prefix is dropped then (cached keys/values never
outlive their weights), and every result names the weight version(s) its tokens came from.

Placement. Without a mesh, `replicas=R` keeps a full copy of the weights on each of R local devices and
splits the slots over them (every program per replica under `shard_map`; on a CPU host with one XLA
device per core this is how the engine uses more than one core). With a mesh, the parameters live in
their rule-given shardings and XLA partitions the programs.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout.engine.compiles import CompileCounter, counting
from mpa_jax.rollout.engine.decoder import SUPPORTED_FAMILIES, SlotDecoder, bucket
from mpa_jax.rollout.engine.scheduler import GenerationFuture, SlotLoop, SlotRequest
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams, Update

__all__ = ["Engine", "check_vocab_limit", "slot_support"]

DEFAULT_SLOT_LEN = 4096  # tokens per slot when not given (capped at the model's max positions)


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


def slot_support(engine: Any) -> str | None:
    """None when `engine` decodes in slots (the embedded engine, any model family), else why not."""
    if not isinstance(engine, Engine):
        return f"{type(engine).__name__} is not the embedded engine"
    if engine.cfg.family not in SUPPORTED_FAMILIES:
        return f"model family {engine.cfg.family!r} has no slot decoding (supported: {', '.join(SUPPORTED_FAMILIES)})"
    return None


class Engine:
    """The embedded engine (`RolloutEngine` + `submit`) running a `mpa_jax.models` model in-process.

    Args:
      model_cfg: the model config (family, shapes, compute dtype).
      params: the parameter pytree (as from `models.init_params` / `models.from_pretrained`); copied.
      slots: decode slots (rows decoding at once; default `max_batch`); rounded up to a power of two
        per replica.
      slot_len: tokens per slot: prompt + max_new_tokens of the longest request that runs in a slot
        (longer ones run on a private, larger decoder between chunks). Default 4,096; at most the max
        positions. A chunk attends over a quarter of the columns or all of them, by what its rows hold.
      chunk: decode steps between admissions (and stream updates); `long_chunk` (default 4 x chunk)
        for a lone request.
      replicas: without a mesh, local devices each holding a copy of the weights and a share of the
        slots (see the module docstring); must be 1 with a mesh.
      mesh, rules: optional device mesh and logical-axis rules; parameters are placed accordingly.
      vocab_limit: ids >= vocab_limit are never sampled (their logits are -inf in every path, greedy
        and sampled): the tokenizer's size when the embedding is padded past it. None: the model's
        whole vocabulary. Learner log-probs must use the same limit (`chunked_logprobs(vocab_limit=)`).
      weight_version: label reported with every result until the next `update_weights`.
      max_batch: default slot count.
      max_prefill: rows per replica in one prefill (extend) call.
      prefill_chunk: tokens per row of one prefill call: every prompt is prefilled in chunks of this
        size (one compiled program whatever the prompt lengths; larger: fewer calls, more padding).
      prefix_cache: reuse what slot rows hold (an episode's earlier turns, a group's shared prompt, a
        common prefix); False prefills every prompt whole.
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
        max_prefill: int = 4,
        prefill_chunk: int = 256,
        prefix_cache: bool = True,
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
        if prefill_chunk < 1:
            raise ValueError(f"Engine: prefill_chunk must be >= 1, got {prefill_chunk}")
        self.max_batch = int(max_batch)
        self.prefix_cache = bool(prefix_cache)
        self._slot_cfg = {"slots": int(slots) if slots is not None else int(max_batch),
                          "max_len": min(int(slot_len) if slot_len is not None else DEFAULT_SLOT_LEN, cfg.max_position_embeddings),
                          "chunk": int(chunk), "long_chunk": long_chunk, "max_prefill": int(max_prefill),
                          "prefill_chunk": int(prefill_chunk)}
        self.idle_exit_s = float(idle_exit_s)
        self._signature = _tree_signature(params)
        self._weights = (self._own(params), str(weight_version))  # swapped as one tuple: params and label agree
        self._loop: SlotLoop | None = None
        self._build = threading.Lock()  # guards creating / replacing the slot loop
        self._slot_compiles = CompileCounter()
        self._programs: set[tuple] = set()  # program shapes of decoders replaced or private (oversize requests)
        self.device_s = 0.0  # wall time inside generate / generate_batch (rollout cost accounting)

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "float32", compute_dtype: str | None = None, mesh: Any = None,
                        rules: Any = None, **kw: Any) -> "Engine":
        """Engine over an exported Hugging Face checkpoint directory (weight version: the directory name);
        `compute_dtype` (default: the checkpoint's config) is the dtype the engine computes in."""
        model = models.from_pretrained(path, dtype=dtype, mesh=mesh, rules=rules)
        kw.setdefault("weight_version", os.path.basename(os.path.normpath(path)))
        cfg = model.cfg if compute_dtype is None else model.cfg.replace(compute_dtype=compute_dtype)
        return cls(cfg, model.params, mesh=mesh, rules=rules, **kw)

    # ---- what callers need to know ---------------------------------------------------------------

    @property
    def cfg(self) -> models.ModelConfig:
        """The model config."""
        return self._cfg

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
        """Tokens per slot (prompt + new tokens; longer requests run on a private decoder)."""
        return self._slot_loop().dec.max_len

    @property
    def compiles(self) -> int:
        """XLA compilations this engine's programs needed so far (counted events)."""
        return self._slot_compiles.n

    @property
    def programs(self) -> int:
        """Distinct device programs (shapes) this engine has called: each one compilation at most."""
        loop = self._loop
        return len(self._programs | (loop.dec.programs if loop is not None else set()))

    @property
    def busy(self) -> bool:
        """Whether requests are queued or running."""
        return self._loop is not None and not self._loop.idle

    def stats(self) -> dict[str, float]:
        """Counters of the slot loop: requests admitted / run on the oversize path / stopped early,
        prefill (extend), place and chunk calls, weight updates waiting at a chunk boundary (`pausers`), seconds by phase, decode-slot utilisation; the prefix
        cache: `prompt_tokens` admitted, `cached_tokens` reused, `prefill_tokens` computed,
        `prefill_columns` computed with padding; `programs` (distinct compiled programs) and `compiles`
        (XLA compilations) with `compile_s`."""
        loop = self._loop
        out = {"programs": float(self.programs), "compiles": float(self.compiles), "compile_s": self._slot_compiles.seconds,
               "prompt_tokens": 0.0, "cached_tokens": 0.0, "prefill_tokens": 0.0, "prefill_columns": 0.0}
        if loop is None:
            return out
        out.update({"admitted": float(loop.admitted), "finished": float(loop.finished), "fallback_rows": float(loop.fallback_rows),
                    "cancelled_rows": float(loop.cancelled_rows), "prefills": float(loop.dec.prefills),
                    "chunks": float(loop.dec.steps), "loop_thread": float(loop.thread_alive), "pausers": float(loop.pausers),
                    "prompt_tokens": float(loop.prompt_tokens), "cached_tokens": float(loop.cached_tokens),
                    "prefill_tokens": float(loop.prefill_tokens), "prefill_columns": float(loop.prefill_columns),
                    **{f"{k}_s": v for k, v in loop.seconds.items()}})
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
                loop.invalidate()  # cached keys/values never outlive their weights

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
                self._programs |= self._loop.dec.programs
                self._loop.close()
                self._loop = None
            self._slot_cfg = new

    def _decoder(self, slots: int, max_len: int) -> SlotDecoder:
        c = self._slot_cfg
        return SlotDecoder(self._cfg, slots=slots, max_len=max_len, chunk=c["chunk"], long_chunk=c["long_chunk"],
                           vocab_limit=self._vocab_limit, cache_dtype=self.cache_dtype, replica_mesh=self._replica_mesh,
                           mesh=self._mesh, max_prefill=c["max_prefill"], chunk_tokens=c["prefill_chunk"])

    def _slot_loop(self) -> SlotLoop:
        """The slot loop, built on first use (its caches are allocated then)."""
        loop = self._loop
        if loop is not None:
            return loop
        with self._build:
            if self._loop is None:
                c = self._slot_cfg
                dec = self._decoder(c["slots"], c["max_len"])
                params, version = self._weights
                with counting(self._slot_compiles):
                    dec.set_weights(params, version)
                self._loop = SlotLoop(dec, fallback=self._oversize, idle_exit_s=self.idle_exit_s, compiles=self._slot_compiles,
                                      reuse=self.prefix_cache)
            return self._loop

    def _oversize(self, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int],
                  top_logprobs: int) -> list[GenerateResult]:
        """Requests too long for a slot: a private decoder sized for them (same programs, larger shapes),
        run to the end on the loop's thread between chunks, then freed."""
        longest = max(len(p) + sp.max_new_tokens for p, sp in zip(prompts, params))
        dec = self._decoder(min(len(prompts), self.max_batch), bucket(longest))
        params_, version = self._weights
        dec.set_weights(params_, version)
        loop = SlotLoop(dec, idle_exit_s=0.0, compiles=self._slot_compiles, reuse=False)
        try:
            reqs = [SlotRequest(p, sp, s, top_logprobs) for p, sp, s in zip(prompts, params, seeds)]
            futures = [GenerationFuture(r) for r in reqs]
            loop.submit_all(reqs)
            return [f.result() for f in futures]
        finally:
            self._programs |= dec.programs
            loop.close()

    def warmup(self, prompt_len: int, max_new: int, greedy: bool = False, filtered: bool = False, n_top: int = 0) -> int:
        """Compile the programs a load of `prompt_len`-token prompts and `max_new` new tokens uses (benches:
        compiles out of the timings) by running such a load: one request, then a slot-full. Only while
        idle; returns the programs compiled."""
        loop = self._slot_loop()
        if not loop.idle:
            raise EngineError("warmup: requests are running")
        before = self.programs
        sp = SamplingParams(max_new_tokens=int(max_new), temperature=0.0 if greedy else 1.0, top_k=2 if filtered else -1)
        for n in (1, self.slots):
            self.generate_batch([[1 + (i % 7)] * int(prompt_len) for i in range(n)], [sp] * n, list(range(n)), n_top)
        return self.programs - before

    def close(self) -> None:
        """Stop the slot loop's thread and free its caches (a later request builds them again)."""
        with self._build:
            if self._loop is not None:
                self._programs |= self._loop.dec.programs
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
        reuse: bool = True,
    ) -> list[GenerationFuture]:
        """`submit` for several requests at once: they reach the slots at the same chunk boundary, in
        order (on an idle engine a batch then runs the same way every time: bitwise the same results
        for the same inputs, whatever ran before). Every input is checked before any is queued."""
        prompts, params, seeds = self._rows(prompts, params, seeds, top_logprobs)
        callbacks = list(on_update) if on_update is not None else [None] * len(prompts)
        if len(callbacks) != len(prompts):
            raise ValueError(f"submit_many: {len(callbacks)} callbacks for {len(prompts)} prompts")
        reqs = [SlotRequest(p, sp, s, int(top_logprobs), cb, updates, reuse=reuse)
                for p, sp, s, cb in zip(prompts, params, seeds, callbacks)]
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
        """`generate_rows` (one setting, or one per prompt) with the prefix cache off for these rows: each
        prompt prefilled whole. The reference that reuse must match (tests, benches)."""
        rows = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        row_seeds = list(seeds) if seeds is not None else [sp.seed + i for i, sp in enumerate(rows)]
        t0 = time.perf_counter()
        futures = self.submit_many(prompts, rows, row_seeds, top_logprobs=top_logprobs, reuse=False)
        try:
            return [f.result() for f in futures]
        finally:
            self.device_s += time.perf_counter() - t0
