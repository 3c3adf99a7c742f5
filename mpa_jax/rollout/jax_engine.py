"""The embedded JAX sampler: batched prefill + jitted decode loop over a preallocated KV cache.

One compiled program per shape bucket `(batch, prompt_len, new_tokens)` (each rounded up to a power
of two) and per static sampling path (greedy / sampled / sampled with top-k/top-p filters); every
numeric sampling knob (temperature, top-p, top-k, max_new_tokens, stop ids, seeds) is a traced
argument, so new prompt lengths or settings inside a bucket never recompile.

Prompts are left-padded to the bucket length, so every row's last prompt token sits in the last
column: the prefill feeds columns [0, P-1) (its logits are unused, so XLA drops the unembedding) and
the decode loop starts by feeding the last prompt token. The loop is a `lax.while_loop` that exits as
soon as every row has sampled a stop token or reached `max_new_tokens`.

Randomness: row `b` draws token `t` from `fold_in(key(seed_b), t)`, so a row's output depends only on
its prompt, its seed and the weights, not on batch composition or padding.

With a mesh, parameters live in their rule-given shardings and the batch is split over the
(`data`, `fsdp`) axes; XLA propagates the rest (the KV cache follows the batch).

Without a mesh, `replicas=R` keeps a full copy of the weights on each of R local devices and splits
every batch into R equal parts that decode independently (`shard_map`: one compiled program, no
communication, each part's loop stops when its own rows finish). On a CPU host with one XLA host
device per core (`--xla_force_host_platform_device_count`) this is how the engine uses more than one
core: XLA:CPU does not split a small decode step usefully over threads (docs/perf.md).
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mpa_jax import models
from mpa_jax.rollout import sampling
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams


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


class JaxEngine:
    """`RolloutEngine` running a `mpa_jax.models` model in-process.

    Args:
      cfg: the model config (family, shapes, compute dtype).
      params: the parameter pytree (as from `models.init_params` / `models.from_pretrained`).
      mesh, rules: optional device mesh and logical-axis rules; parameters are placed accordingly.
      max_batch: rows per compiled program; larger requests run in chunks (prompts sorted by length
        first so that each chunk pads little).
      replicas: without a mesh, the number of local devices holding a copy of the weights, each
        decoding its share of the batch (see the module docstring); must be 1 with a mesh.
      min_prompt_bucket, min_new_bucket: smallest shape buckets (fewer tiny compilations).
      weight_version: label reported with every result until the next `update_weights`.
      vocab_limit: ids >= vocab_limit are never sampled (their logits are -inf in every path, greedy
        and sampled): the tokenizer's size when the embedding is padded past it. None: the model's
        whole vocabulary. Learner log-probs must use the same limit (`chunked_logprobs(vocab_limit=)`).
    """

    def __init__(
        self,
        cfg: models.ModelConfig,
        params: Any,
        *,
        mesh: jax.sharding.Mesh | None = None,
        rules: Any = None,
        max_batch: int = 16,
        min_prompt_bucket: int = 16,
        min_new_bucket: int = 16,
        weight_version: str = "0",
        cache_dtype: str | None = None,
        replicas: int = 1,
        vocab_limit: int | None = None,
    ) -> None:
        check_vocab_limit(vocab_limit, cfg.vocab_size)
        if max_batch < 1:
            raise ValueError(f"JaxEngine: max_batch must be >= 1, got {max_batch}")
        if replicas < 1 or (mesh is not None and replicas != 1):
            raise ValueError(f"JaxEngine: replicas must be >= 1, and 1 with a mesh; got {replicas}")
        if replicas > jax.local_device_count():
            raise ValueError(f"JaxEngine: replicas={replicas} but only {jax.local_device_count()} local devices")
        self.cfg = cfg
        self.mesh = mesh
        self.rules = rules
        self.min_prompt_bucket = min_prompt_bucket
        self.min_new_bucket = min_new_bucket
        self.cache_dtype = cache_dtype
        self.replicas = replicas
        self.vocab_limit = int(vocab_limit) if vocab_limit is not None else int(cfg.vocab_size)
        self._data_size = replicas
        self._param_shardings = None
        self._replica_mesh = None
        if mesh is not None:
            from mpa_jax import sharding

            self._param_shardings = sharding.param_shardings(cfg, mesh, rules)
            self._data_size = int(np.prod([mesh.shape[a] for a in ("data", "fsdp") if a in mesh.shape]))
        elif replicas > 1:
            self._replica_mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:replicas]), ("replica",))
        # Batch buckets must split evenly over the data-parallel devices.
        self.max_batch = _bucket(max(max_batch, self._data_size), self._data_size)
        self._signature = _tree_signature(params)
        self.params = self._place(params)
        self._weight_version = str(weight_version)
        self.device_s = 0.0  # wall time inside generate (rollout cost accounting)
        self.compiles = 0

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "float32", mesh: Any = None, rules: Any = None, **kw: Any) -> "JaxEngine":
        """Engine over an exported Hugging Face checkpoint directory."""
        model = models.from_pretrained(path, dtype=dtype, mesh=mesh, rules=rules)
        kw.setdefault("weight_version", os.path.basename(os.path.normpath(path)))
        return cls(model.cfg, model.params, mesh=mesh, rules=rules, **kw)

    # ---- weights ---------------------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._weight_version

    def _place(self, params: Any) -> Any:
        if self._param_shardings is not None:
            return jax.device_put(params, self._param_shardings)
        if self._replica_mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec

            return jax.device_put(params, NamedSharding(self._replica_mesh, PartitionSpec()))
        return jax.device_put(params)

    def update_weights(self, source: Any, version: str) -> None:
        """Swap in new weights: a params pytree, or an exported HF checkpoint directory.

        The new weights must have the same structure, shapes and dtypes (no recompilation); they take
        effect on the next `generate`.
        """
        if isinstance(source, (str, os.PathLike)):
            model = models.from_pretrained(os.fspath(source), dtype=self.cfg.param_dtype, mesh=self.mesh, rules=self.rules)
            if model.cfg.replace(extra={}) != self.cfg.replace(extra={}):
                raise EngineError(f"checkpoint {os.fspath(source)} has a different model config than the engine")
            params = model.params
        else:
            params = source
        sig = _tree_signature(params)
        if sig != self._signature:
            raise EngineError("update_weights: new params differ in structure, shape or dtype from the engine's")
        self.params = self._place(params)
        self._weight_version = str(version)

    # ---- generation ------------------------------------------------------------------------------

    def _program(self, n_new: int, greedy: bool, filtered: bool):
        """The jitted generate program for a new-token bucket and sampling path (jax caches per shape)."""
        return _jitted_generate(self.cfg, n_new, greedy, filtered, self.cache_dtype, self._replica_mesh, self.vocab_limit)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerateResult]:
        """Continue every prompt (results in prompt order); see the module docstring for semantics."""
        prompts = [list(map(int, p)) for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        vocab = self.cfg.vocab_size
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"generate: prompt {i} is empty")
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"generate: prompt {i} has a token id outside [0, {vocab})")
            if len(p) + params.max_new_tokens > self.cfg.max_position_embeddings:
                raise ValueError(
                    f"generate: prompt {i} ({len(p)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds"
                    f" max_position_embeddings ({self.cfg.max_position_embeddings})"
                )
        for t in params.stop_token_ids:
            if not 0 <= t < vocab:
                raise ValueError(f"generate: stop token id {t} outside [0, {vocab})")
        row_seeds = [int(s) for s in seeds] if seeds is not None else [params.seed + i for i in range(len(prompts))]
        t0 = time.perf_counter()
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[GenerateResult | None] = [None] * len(prompts)
        for lo in range(0, len(order), self.max_batch):
            idx = order[lo : lo + self.max_batch]
            chunk = self._generate_chunk([prompts[i] for i in idx], params, [row_seeds[i] for i in idx])
            for i, r in zip(idx, chunk):
                results[i] = r
        self.device_s += time.perf_counter() - t0
        return [r for r in results if r is not None]

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int]) -> list[GenerateResult]:
        n = len(prompts)
        d = self._data_size
        b = -(-_bucket(n, 1) // d) * d  # a power of two, rounded up to split evenly over the data axes
        p_len = _bucket(max(len(p) for p in prompts), self.min_prompt_bucket)
        n_new = _bucket(params.max_new_tokens, self.min_new_bucket)
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
        n_stop = _bucket(len(params.stop_token_ids), 4)
        stops = np.full((n_stop,), -1, np.int32)
        stops[: len(params.stop_token_ids)] = params.stop_token_ids
        inputs = self._shard_batch((ids, mask, active, seed_arr))
        scalars = (
            jnp.int32(params.max_new_tokens),
            jnp.float32(params.temperature),
            jnp.int32(params.top_k),
            jnp.float32(params.top_p),
            jnp.asarray(stops),
        )
        program = self._program(n_new, params.greedy, params.filtered)
        before = program._cache_size() if hasattr(program, "_cache_size") else 0
        tokens, lps, n_gen, stopped = program(self.params, *inputs, *scalars)
        if hasattr(program, "_cache_size") and program._cache_size() > before:
            self.compiles += 1
        tokens, lps, n_gen, stopped = jax.device_get((tokens, lps, n_gen, stopped))
        out = []
        for r in range(n):
            k = int(n_gen[r])
            toks = [int(t) for t in tokens[r, :k]]
            is_stop = bool(stopped[r])
            out.append(
                GenerateResult(
                    token_ids=toks,
                    logprobs=[float(x) for x in lps[r, :k]],
                    finish_reason="stop" if is_stop else "length",
                    matched_stop=toks[-1] if is_stop else None,
                    prompt_tokens=len(prompts[r]),
                    weight_version=self._weight_version,
                )
            )
        return out

    def _shard_batch(self, arrays: tuple) -> tuple:
        if self.mesh is None and self._replica_mesh is None:
            return tuple(jnp.asarray(a) for a in arrays)
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = self.mesh if self.mesh is not None else self._replica_mesh
        axes = tuple(a for a in ("data", "fsdp", "replica") if a in mesh.shape)
        out = []
        for a in arrays:
            spec = PartitionSpec(axes, *([None] * (a.ndim - 1)))
            out.append(jax.device_put(a, NamedSharding(mesh, spec)))
        return tuple(out)


@functools.lru_cache(maxsize=None)
def _jitted_generate(
    cfg: models.ModelConfig,
    n_new: int,
    greedy: bool,
    filtered: bool,
    cache_dtype: str | None,
    replica_mesh: jax.sharding.Mesh | None = None,
    vocab_limit: int | None = None,
):
    """One jitted program per (model config, new-token bucket, sampling path, replica mesh, vocabulary
    limit), shared by every engine instance, so a new engine or new weights of the same architecture
    never recompile."""
    fn = functools.partial(_generate, cfg, n_new, greedy, filtered, cache_dtype, vocab_limit)
    if replica_mesh is not None:
        from jax.sharding import PartitionSpec as P

        rows, rep = P("replica"), P()
        fn = jax.shard_map(
            fn,
            mesh=replica_mesh,
            in_specs=(rep, rows, rows, rows, rows, rep, rep, rep, rep, rep),
            out_specs=(rows, rows, rows, rows),
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
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Prefill + decode loop. Returns tokens [B, n_new], log-probs, tokens generated [B], stopped [B]."""
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

    def cond(carry):
        t, _, _, _, _, done, _, _ = carry
        return (t < max_new) & ~jnp.all(done)

    def body(carry):
        t, logits, state, out_tok, out_lp, done, n_gen, stopped = carry
        tok, lp = sampling.sample_step(
            sampling.mask_vocab(logits[:, 0], vocab_limit), keys, t, temperature, top_k, top_p, greedy=greedy, filtered=filtered
        )
        live = ~done
        tok = jnp.where(live, tok, 0)
        out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, t))
        out_lp = jax.lax.dynamic_update_slice(out_lp, jnp.where(live, lp, 0.0)[:, None], (0, t))
        n_gen = n_gen + live.astype(jnp.int32)
        hit = live & jnp.any(tok[:, None] == stops[None, :], axis=1)
        stopped = stopped | hit
        done = done | hit | (t + 1 >= max_new)
        step_mask = (~done).astype(jnp.int32)[:, None]  # finished rows' filler tokens are never attended
        logits, state = models.decode(cfg, params, tok[:, None], (last_pos + t + 1)[:, None], state, step_mask)
        return t + 1, logits, state, out_tok, out_lp, done, n_gen, stopped

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
    _, _, _, out_tok, out_lp, _, n_gen, stopped = jax.lax.while_loop(cond, body, carry)
    return out_tok, out_lp, n_gen, stopped
