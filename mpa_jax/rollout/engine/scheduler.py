"""`SlotLoop`: the engine's host scheduler, a thread that admits requests into slots and runs decode chunks.

Between chunks the loop admits waiting requests into free slots, reusing what the rows hold (the prefix
cache, `prefix.PrefixIndex`): a request whose prompt starts with what a free row holds continues that
row in place (the next turn of an episode computes only its new tokens); one whose prompt shares a
prefix with any row of its replica gets that prefix copied (`SlotDecoder.place`: a group's G samples
prefill their prompt once; a system prompt and tool schemas common to every episode are computed once);
the rest of each prompt is prefilled in fixed-size chunks (`SlotDecoder.extend`). Requests admitted
together whose prompts share a prefix with another one of them wait one round inside the same
admission, so the shared part is computed once. Then it hands each request its new tokens
(`on_update`), resolves its future with the `GenerateResult` (`cached_tokens`: prompt tokens it did not
compute), retires finished or stopped requests (their rows keep what they hold), and runs the next
chunk. A lone settled request runs in chunks of `long_chunk` steps. Weight updates happen between
chunks (`paused()`) and invalidate every cached prefix; every result names the weight versions its
tokens came from. The thread exits after `idle_exit_s` without work and restarts on the next request.

Token t of a request is drawn from `fold_in(key(seed), t)`, so a request's tokens do not depend on what
else runs or on what was reused (up to float rounding between shapes). Requests too long for a slot
run through `fallback` between chunks.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from mpa_jax.rollout.engine.compiles import CompileCounter, counting
from mpa_jax.rollout.engine.decoder import SlotDecoder, bucket
from mpa_jax.rollout.engine.prefix import PrefixIndex
from mpa_jax.rollout.types import EngineError, GenerateResult, SamplingParams, Update

log = logging.getLogger(__name__)

__all__ = ["SlotLoop", "SlotRequest", "GenerationFuture", "timed_wait"]


@dataclasses.dataclass(eq=False)
class SlotRequest:
    """One row to generate. `on_update` (optional) is called from the loop's thread after every chunk
    with the new tokens when `updates`, else once with the result; `future` gets the result. Set
    `cancelled` to end it early (its result then carries the tokens so far, finish_reason "length").
    `versions`: the weight versions its tokens came from, in order; `cached`: prompt tokens reused."""

    prompt: list[int]
    params: SamplingParams
    seed: int
    top_logprobs: int = 0
    on_update: Callable[[Update], None] | None = None
    updates: bool = True
    cancelled: bool = False
    future: "GenerationFuture | None" = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    tops: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    versions: list[str] = dataclasses.field(default_factory=list)
    cached: int = 0
    gen: int = -1
    reuse: bool = True  # False: its prompt is prefilled whole (the reference of the parity tests)


class GenerationFuture(concurrent.futures.Future):
    """The `GenerateResult` of one submitted request. `cancel()` drops it while it waits for a slot;
    `stop()` ends it while it runs (the result holds the tokens so far, finish_reason "length")."""

    def __init__(self, request: SlotRequest) -> None:
        super().__init__()
        self.request = request
        request.future = self

    def stop(self) -> None:
        self.request.cancelled = True


@dataclasses.dataclass
class _Admission:
    req: SlotRequest
    dst: int
    src: int
    keep: int


class SlotLoop:
    """The host loop over a `SlotDecoder` on its own thread (see the module docstring).

    `submit_all(requests)` is thread-safe; `idle` tells whether nothing is queued or running; `paused()`
    holds the loop between chunks (weight updates, then `invalidate()`). `fallback(prompts, params,
    seeds, top_logprobs)` generates the requests too long for a slot. `reuse=False` turns the prefix
    cache off (every prompt prefilled whole: the reference the parity tests compare with).
    """

    def __init__(self, decoder: SlotDecoder, fallback: Callable[..., list[GenerateResult]] | None = None,
                 idle_exit_s: float = 2.0, compiles: CompileCounter | None = None, reuse: bool = True) -> None:
        self.dec = decoder
        self.compiles = compiles if compiles is not None else CompileCounter()
        self.fallback = fallback
        self.idle_exit_s = float(idle_exit_s)
        self.reuse = bool(reuse)
        s = decoder.slots
        self.index = PrefixIndex(s, recurrent=any(a is None for leaves in _axes(decoder.cfg).values() for a in leaves.values()))
        self._queue: "queue.SimpleQueue[SlotRequest]" = queue.SimpleQueue()
        self._waiting: list[SlotRequest] = []
        self._admitting: list[SlotRequest] = []
        self._slot: list[SlotRequest | None] = [None] * s
        self._pos = np.zeros((s,), np.int32)
        self._t = np.zeros((s,), np.int32)
        self._live = np.zeros((s,), bool)
        self._seeds = np.zeros((s,), np.uint32)
        self._temperature = np.zeros((s,), np.float32)
        self._top_k = np.full((s,), -1, np.int32)
        self._top_p = np.ones((s,), np.float32)
        self._max_new = np.ones((s,), np.int32)
        self._n_stop = 4
        self._stops = np.full((s, self._n_stop), -1, np.int32)
        self._wake = threading.Event()
        self._gate = threading.Lock()  # held by the loop while it works; pause() takes it
        # Threads waiting in `paused()`: the loop lets them in before it takes the gate again (a Lock is not
        # fair: the loop could re-take it chunk after chunk while a weight update waited).
        self._pausers = 0
        self._pausers_cv = threading.Condition()
        self._life = threading.Lock()
        self._enqueue = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._count = threading.Lock()
        self.pending = 0
        self.admitted = 0
        self.finished = 0
        self.fallback_rows = 0
        self.cancelled_rows = 0
        # Prompt-side token accounting: tokens of admitted prompts, those reused from the prefix cache,
        # those computed (prefilled), and the columns the prefill calls computed (padding included).
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prefill_tokens = 0
        self.prefill_columns = 0
        self.seconds = {"admit": 0.0, "decode": 0.0, "deliver": 0.0}
        self.live_rows = 0
        self.slot_steps = 0
        self.busy_slot_steps = 0
        self.queued_slot_steps = 0
        self.queued_busy_slot_steps = 0
        self._churn = False

    # ---- public ------------------------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        self.submit_all([request])

    def submit_all(self, requests: list[SlotRequest]) -> None:
        """Queue `requests` as one group: the loop sees all of them at the same chunk boundary (a batch
        call on an idle loop then runs the same way every time)."""
        with self._count:
            self.pending += len(requests)
        with self._enqueue:
            for r in requests:
                self._queue.put(r)
        with self._life:
            if self._stop:
                raise RuntimeError("SlotLoop.submit: the loop is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpa-slots", daemon=True)
                self._thread.start()
        self._wake.set()

    @property
    def idle(self) -> bool:
        return self.pending == 0

    @property
    def thread_alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def pausers(self) -> int:
        """Callers of `paused()` (weight updates) waiting for, or holding, a chunk boundary."""
        return self._pausers

    @property
    def running(self) -> int:
        return sum(r is not None for r in self._slot)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the loop between chunks while the `with` block runs (from the next chunk boundary on)."""
        with self._pausers_cv:
            self._pausers += 1
        try:
            with self._gate:
                yield
        finally:
            with self._pausers_cv:
                self._pausers -= 1
                self._pausers_cv.notify_all()

    def invalidate(self) -> None:
        """Drop every cached prefix (new weights); call while paused."""
        self.index.invalidate()

    def _let_pausers_in(self) -> None:
        with self._pausers_cv:
            self._pausers_cv.wait_for(lambda: self._pausers == 0)

    def utilisation(self) -> dict[str, float]:
        """Decode-slot use: the fraction of slot-steps that emitted a token, over all chunks and over
        chunks that started with requests waiting for a slot."""
        return {"slot_busy": self.busy_slot_steps / self.slot_steps if self.slot_steps else 0.0,
                "slot_busy_queued": self.queued_busy_slot_steps / self.queued_slot_steps if self.queued_slot_steps else 0.0,
                "slot_steps": float(self.slot_steps), "busy_slot_steps": float(self.busy_slot_steps),
                "queued_slot_steps": float(self.queued_slot_steps), "queued_busy_slot_steps": float(self.queued_busy_slot_steps)}

    def close(self) -> None:
        """Stop the thread (requests still queued or running get an error)."""
        with self._life:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=60)

    # ---- loop --------------------------------------------------------------------------------------

    def _run(self) -> None:
        with counting(self.compiles):
            self._loop()

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            if self._stop:
                with self._gate:
                    self._fail_all(RuntimeError("the engine was closed"))
                return
            if not self._live.any() and self._queue.empty() and not self._waiting:
                with self._life:
                    if self._queue.empty() and time.monotonic() - idle_since > self.idle_exit_s:
                        self._thread = None
                        return
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self._let_pausers_in()
            with self._gate:
                try:
                    t0 = time.perf_counter()
                    self._admit()
                    self.seconds["admit"] += time.perf_counter() - t0
                    if self._live.any():
                        self._step()
                except Exception as e:  # noqa: BLE001 - every running request gets the error, the loop goes on
                    log.exception("slot loop failed")
                    self._fail_all(e)
            idle_since = time.monotonic()

    def _finish(self, req: SlotRequest, result: GenerateResult | None, error: BaseException | None = None,
                new: tuple[list[int], list[float], Any] = ([], [], None)) -> None:
        with self._count:
            self.pending -= 1
            self.finished += 1
        if req.on_update is not None:
            try:
                req.on_update(Update(new[0], new[1], new[2], result=result, error=error))
            except Exception:  # noqa: BLE001 - a consumer's failure must not stop the loop
                log.exception("slot loop: on_update failed")
        fut = req.future
        if fut is not None and not fut.done():
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _fail_all(self, e: BaseException) -> None:
        e = _engine_error(e)
        for s, req in enumerate(self._slot):
            if req is not None:
                self._slot[s] = None
                self._live[s] = False
                self.index.clear(s)
                self._finish(req, None, e)
        while not self._queue.empty():
            self._waiting.append(self._queue.get())
        for req in self._admitting + self._waiting:
            self._finish(req, None, e)
        for s in range(self.dec.slots):  # a failed admission leaves rows half written
            if self._slot[s] is None:
                self.index.clear(s)
        self._admitting, self._waiting = [], []

    # ---- admission -----------------------------------------------------------------------------------

    def _admit(self) -> None:
        with self._enqueue:
            arrived = []
            while not self._queue.empty():
                arrived.append(self._queue.get())
        for req in arrived:
            if req.future is not None and not req.future.set_running_or_notify_cancel():
                with self._count:
                    self.pending -= 1
                self.cancelled_rows += 1
                continue
            self._waiting.append(req)
        for req in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(req)
            self.cancelled_rows += 1
            self._finish(req, self._result(req, "length"))
        big = [r for r in self._waiting if not self.dec.fits(len(r.prompt), r.params.max_new_tokens)]
        if big:
            self._waiting = [r for r in self._waiting if r not in big]
            try:
                if self.fallback is None:
                    raise ValueError(f"a request of {len(big[0].prompt)} prompt + {big[0].params.max_new_tokens} new tokens"
                                     f" does not fit a slot of {self.dec.max_len}")
                out = self.fallback([r.prompt for r in big], [r.params for r in big], [r.seed for r in big],
                                    max(r.top_logprobs for r in big))
            except Exception as e:  # noqa: BLE001 - delivered to those requests
                for r in big:
                    self._finish(r, None, _engine_error(e))
            else:
                self.fallback_rows += len(big)
                for r, res in zip(big, out):
                    self._finish(r, res, new=(res.token_ids, res.logprobs, res.top_logprobs))
        while self._waiting:
            plan = self._plan()
            if not plan:
                return
            self._admitting = [a.req for a in plan]
            self._churn = True
            self._execute(plan)
            self._admitting = []

    def _plan(self) -> list[_Admission]:
        """One admission round: a slot (and a row to reuse) for each waiting request that gets one now.
        A request that would reuse more from a prompt admitted in this round waits for the next round."""
        r = self.dec.replicas
        idx = self.index
        free = [s for s in range(self.dec.slots) if self._slot[s] is None]
        load = [sum(self._slot[s] is not None for s in range(k, self.dec.slots, r)) for k in range(r)]
        taken: set[int] = set()  # destinations this round: their content changes
        sources: set[int] = set()  # rows copied from this round: not to be overwritten in it
        planned: list[np.ndarray] = []
        plan: list[_Admission] = []
        rest: list[SlotRequest] = []
        for req in self._waiting:
            avail = [s for s in free if s not in taken]
            if not avail:
                rest.append(req)
                continue
            prompt = np.asarray(req.prompt, np.int32)
            best: tuple[int, int, int, int] = (0, 0, -1, -1)  # (tokens reused, in place, donor, destination)
            if self.reuse and req.reuse:
                for d in range(self.dec.slots):
                    if d in taken:
                        continue
                    m = idx.match(d, prompt)
                    if m <= best[0]:
                        continue
                    cut = m < len(idx.held[d])
                    if self._slot[d] is None and not (cut and d in sources):
                        best = (m, 1, d, d)
                        continue
                    dst = self._evict(avail, d % r, sources, load)
                    if dst is not None:
                        best = max(best, (m, 0, d, dst))
                if planned and max(idx.usable(p, True, prompt) for p in planned) > best[0]:
                    rest.append(req)  # a prompt admitted this round holds more of this one: next round
                    continue
            if best[0] == 0:
                dst = self._evict(avail, None, sources, load)
                assert dst is not None
                best = (0, 0, dst, dst)
            m, _, src, dst = best
            plan.append(_Admission(req, dst, src, m))
            taken.add(dst)
            if src != dst:
                sources.add(src)
            load[dst % r] += 1
            planned.append(prompt)
        self._waiting = rest
        return plan

    def _evict(self, avail: list[int], replica: int | None, keep_out: set[int], load: list[int]) -> int | None:
        """The free slot to give a request: on `replica` (any: the least loaded), holding nothing
        reusable if possible, else the least recently used; never a row copied from this round."""
        r = self.dec.replicas
        cands = [s for s in avail if s not in keep_out and (replica is None or s % r == replica)]
        if not cands:
            return None
        return min(cands, key=lambda s: (load[s % r] if replica is None else 0, self.index.valid(s), self.index.used[s], s))

    def _execute(self, plan: list[_Admission]) -> None:
        dec = self.dec

        def piece(a: _Admission, at: int) -> int:
            # Full chunks while much is left, then short ones: a 100-token rest (a turn's tool result and
            # template) in a full chunk would compute 2.5x the columns of two short calls.
            return dec.chunk_tokens if len(a.req.prompt) - at > 5 * dec.small_chunk // 2 else dec.small_chunk

        # First calls: each row's placement with the first piece of the rest of its prompt. Copies go first,
        # so that no row is continued before every copy of it in this round has read it. Calls never mix
        # full and short pieces (a call is as long as its longest row).
        first = sorted(plan, key=lambda a: (a.src == a.dst, piece(a, a.keep)))
        rows = [(a.src, a.dst, a.keep, a.keep == len(a.req.prompt), a.req.prompt[a.keep:a.keep + piece(a, a.keep)], a.keep)
                for a in first]
        at = {id(a): a.keep + len(row[4]) for a, row in zip(first, rows)}
        while rows:
            for group in _split(rows, lambda row: (row[1] % dec.replicas, len(row[4]) > dec.small_chunk), dec.max_prefill):
                before = dec.columns
                dec.admit(group)
                self.prefill_columns += dec.columns - before
            # Later calls: the next piece of each longer prompt, its row left as it is.
            rows = []
            for a in sorted(plan, key=lambda a: piece(a, at[id(a)])):
                k = at[id(a)]
                if len(a.req.prompt) > k:
                    rows.append((a.dst, a.dst, k, False, a.req.prompt[k:k + piece(a, k)], k))
                    at[id(a)] = k + len(rows[-1][4])
        for a in plan:
            req = a.req
            req.cached = a.keep
            req.gen = self.index.gen
            self.prompt_tokens += len(req.prompt)
            self.cached_tokens += a.keep
            self.prefill_tokens += len(req.prompt) - a.keep
            self.index.set(a.dst, req.prompt, ready=True)
            self._place(a.dst, req)
        self.admitted += len(plan)

    def _place(self, s: int, r: SlotRequest) -> None:
        sp = r.params
        self._slot[s] = r
        self._pos[s] = len(r.prompt)
        self._t[s] = 0
        self._live[s] = True
        self._seeds[s] = r.seed % (2**32)
        self._temperature[s] = sp.temperature
        self._top_k[s] = sp.top_k
        self._top_p[s] = sp.top_p
        self._max_new[s] = sp.max_new_tokens
        r.versions.append(self.dec.version)  # the prefill's weights give the first token
        if len(sp.stop_token_ids) > self._n_stop:  # more stop ids than columns: widen (one recompile)
            self._n_stop = bucket(len(sp.stop_token_ids))
            wider = np.full((self.dec.slots, self._n_stop), -1, np.int32)
            wider[:, : self._stops.shape[1]] = self._stops
            self._stops = wider
        self._stops[s] = -1
        self._stops[s, : len(sp.stop_token_ids)] = sp.stop_token_ids

    # ---- decoding ------------------------------------------------------------------------------------

    def _step(self) -> None:
        live_reqs = [r for r in self._slot if r is not None]
        greedy = all(r.params.greedy for r in live_reqs)
        filtered = not greedy and any(r.params.filtered and not r.params.greedy for r in live_reqs)
        want = max(r.top_logprobs for r in live_reqs)
        n_top = bucket(want) if want else 0
        queued = bool(self._waiting)
        steps = self.dec.long_chunk if self._lone() else self.dec.chunk
        steps = max(1, min(steps, int((self._max_new - self._t)[self._live].max())))
        span = self.dec.span(int(self._pos[self._live].max()) + steps)
        self.live_rows += len(live_reqs)
        for r in live_reqs:
            if r.versions[-1] != self.dec.version:
                r.versions.append(self.dec.version)
        t0 = time.perf_counter()
        toks, lps, emitted, live, stopped, *tops = self.dec.decode(
            self._pos, self._t, self._live, self._seeds, self._temperature, self._top_k, self._top_p, self._max_new,
            self._stops, greedy=greedy, filtered=filtered, n_top=n_top, steps=steps, span=span)
        t1 = time.perf_counter()
        self.seconds["decode"] += t1 - t0
        busy = int(emitted.sum())
        self.slot_steps += steps * self.dec.slots
        self.busy_slot_steps += busy
        if queued:
            self.queued_slot_steps += steps * self.dec.slots
            self.queued_busy_slot_steps += busy
        self._deliver(toks, lps, emitted, live, stopped, tops)
        self.seconds["deliver"] += time.perf_counter() - t1

    def _deliver(self, toks: np.ndarray, lps: np.ndarray, emitted: np.ndarray, live: np.ndarray, stopped: np.ndarray,
                 tops: list[np.ndarray]) -> None:
        """Hand each running request its new tokens; retire the finished and cancelled ones (their rows
        keep what they hold, for a next turn or a shared prefix)."""
        for s, req in enumerate(self._slot):
            if req is None:
                continue
            k = int(emitted[s].sum())
            new_t = toks[s, :k].tolist()
            new_lp = lps[s, :k].tolist()
            new_top = None
            if req.top_logprobs:
                new_top = [[(int(i), float(v)) for i, v in zip(tops[0][s, j, : req.top_logprobs], tops[1][s, j, : req.top_logprobs])]
                           for j in range(k)]
                req.tops.extend(new_top)
            req.tokens.extend(new_t)
            req.logprobs.extend(new_lp)
            self._t[s] += k
            still = bool(live[s])
            self._pos[s] += k if still else max(k - 1, 0)  # a finished row's last token was never fed
            done = not still or req.cancelled
            if done:
                self._churn = True
                self.cancelled_rows += int(req.cancelled and still)
                self._slot[s] = None
                self._live[s] = False
                fed = req.tokens if still else req.tokens[:-1]
                if len(fed) == self._pos[s] - len(req.prompt):
                    self.index.set(s, req.prompt + fed, ready=False, gen=req.gen)
                else:  # bookkeeping disagrees with the device: never reuse this row
                    self.index.clear(s)
                self._finish(req, self._result(req, "stop" if bool(stopped[s]) else "length"), new=(new_t, new_lp, new_top))
            else:
                if k:
                    self.index.set(s, req.prompt + req.tokens, ready=True, gen=req.gen)
                if k and req.updates and req.on_update is not None:
                    try:
                        req.on_update(Update(new_t, new_lp, new_top))
                    except Exception:  # noqa: BLE001
                        log.exception("slot loop: on_update failed")

    def _lone(self) -> bool:
        """Whether the next chunk may be long: one request running, nothing admitted or retired at this
        boundary, none waiting, and at least a long chunk of budget left."""
        dec = self.dec
        churn, self._churn = self._churn, False
        if dec.long_chunk == dec.chunk or churn or self._waiting or not self._queue.empty():
            return False
        left = (self._max_new - self._t)[self._live]
        return left.size == 1 and int(left[0]) >= dec.long_chunk

    def _result(self, req: SlotRequest, finish: str) -> GenerateResult:
        toks = req.tokens
        versions = req.versions or [self.dec.version]
        return GenerateResult(
            token_ids=list(toks), logprobs=list(req.logprobs), finish_reason=finish,
            matched_stop=toks[-1] if finish == "stop" and toks else None, prompt_tokens=len(req.prompt),
            weight_version=versions[0], weight_versions=tuple(versions),
            top_logprobs=list(req.tops) if req.top_logprobs else None, cached_tokens=req.cached)


def _axes(cfg: Any) -> dict[str, Any]:
    from mpa_jax import models

    return models.slot_cache_axes(cfg)


def _split(items: list, key: Callable[[Any], tuple[int, bool]], per_call: int) -> list[list]:
    """`items` in calls of at most `per_call` per replica, in order; `key(item)` = (its replica, its
    class): a new call starts where the class changes."""
    calls: list[list] = []
    counts: dict[int, int] = {}
    current: list = []
    kind = None
    for it in items:
        k, c = key(it)
        if current and (counts.get(k, 0) == per_call or c != kind):
            calls.append(current)
            current, counts = [], {}
        current.append(it)
        counts[k] = counts.get(k, 0) + 1
        kind = c
    if current:
        calls.append(current)
    return calls


def _engine_error(e: BaseException) -> EngineError:
    """What a request's future raises when the engine failed it: an EngineError (callers treat it as infra)."""
    if isinstance(e, EngineError):
        return e
    err = EngineError(f"{type(e).__name__}: {e}")
    err.__cause__ = e
    return err


def timed_wait(pred: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `pred` until true or timeout (shutdown; tests wait on futures or counted events instead)."""
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True
