"""The engine thread: schedule -> decode -> sample -> deliver, forever.

HTTP handlers never touch llama.cpp. They build a ``Request`` and call
``submit``; the engine thread owns the context, runs one batched
``llama_decode`` per step over every running sequence, and hands each step's
output to ``publish`` once (the API layer turns that into one event-loop wakeup
per step, not one per token).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.admission import ContextLimits
from engine.caches.disk_cache import DiskCache, compat_key
from engine.caches.prefix_cache import PrefixCache
from engine.config import DiskCacheConfig, ModelConfig
from engine.delivery import Delivery
from engine.detokenizer import IncrementalDetokenizer
from engine.drafts.coordinator import Drafting
from engine.drafts.forced import DraftSampler, propose_forced, take_forced
from engine.drafts.policy import verify
from engine.embeddings.jobs import EmbedJob, EmbedQueue
from engine.embeddings.runner import EmbeddingRunner
from engine.media.embedding_cache import EmbeddingCache
from engine.media.projector import Projector
from engine.metrics import EngineMetrics
from engine.request import (
    BackendUnavailable,
    Delta,
    EngineError,
    Request,
    Status,
)
from engine.runner import DECODE_NO_KV_SLOT, Runner
from engine.scheduler import BatchItem, Scheduler, StepPlan
from engine.step_budget import StepBudget

log = logging.getLogger("llamaserve.engine")
KV_GAUGE_PERIOD = 0.05  # seconds between llamaserve_kv_cells_used updates while busy

Publish = Callable[[list[tuple[Request, Delta]]], None]


@dataclass(frozen=True)
class _Cancel:
    request: Request


class _CancelAll:
    pass


class _Wake:
    """Wakes an idle engine thread (its backend went down)."""


class Engine:
    def __init__(self, runner: Runner, cfg: ModelConfig, metrics: EngineMetrics | None = None,
                 disk_cache: DiskCacheConfig | None = None, draft_path: str | None = None,
                 mmproj_path: str | None = None, lora_paths: dict[str, str] | None = None):
        self.runner = runner
        self.cfg = cfg
        if lora_paths:
            runner.load_adapters(lora_paths)
        # what a request runs under unless it says otherwise: the configured scales
        self.default_adapters = tuple(sorted((x.name, x.scale) for x in cfg.loras
                                             if x.scale != 0 and x.name in runner.adapters))
        self.metrics = metrics or EngineMetrics()
        self.projector: Projector | None = None
        self.media_cache: EmbeddingCache | None = None
        if mmproj_path is not None and cfg.mtmd is not None:
            self.projector = Projector(
                mmproj_path, runner.model, cfg.mtmd, threads=cfg.mtmd.threads or cfg.threads,
                use_gpu=cfg.n_gpu_layers != 0, n_ubatch=min(cfg.n_ubatch, runner.n_batch))
            runner.media_identity = self.projector.identity
            self.media_cache = EmbeddingCache(
                cfg.mtmd.memory_cache_bytes, cfg.mtmd.embedding_cache,
                {**self.projector.identity, "llama_cpp": runner.state_layout()["llama_cpp"]})
        self.disk = None if disk_cache is None else DiskCache(
            disk_cache, compat_key(runner.model_path, runner.state_layout()), self.metrics)
        self.cache = PrefixCache(runner.n_seq_max, runner, capacity=runner.n_ctx,
                                 unified=runner.unified, n_swa=runner.n_swa, disk=self.disk,
                                 metrics=self.metrics, disk_adapters=self.default_adapters,
                                 snapshot_bytes=cfg.state_snapshots_max_bytes,
                                 parked_bytes=cfg.parked_max_bytes,
                                 is_eog=runner.vocabulary.is_eog)
        # prompt tokens per step while others generate: from measured step costs (a step
        # within prefill_step_target decode-only steps), at most prefill_chunk
        self.step_budget = StepBudget(cfg.prefill_chunk or runner.n_batch,
                                      cfg.prefill_step_target) if cfg.prefill_step_target else None
        self.scheduler = Scheduler(self.cache, runner.n_batch, cfg.prefill_chunk,
                                   self.step_budget)
        self.embedder = EmbeddingRunner(runner, cfg) if (
            runner.embedding_only or cfg.embedding) else None
        self.embeds = EmbedQueue(self.embedder.batch_tokens if self.embedder else 0,
                                 self.embedder.n_seq_max if self.embedder else 0)
        self.drafting = None if cfg.draft_model is None else Drafting(
            runner, cfg, draft_path, self.metrics)
        self.delivery = Delivery(runner, self.scheduler, self.metrics)
        self.limits = ContextLimits(runner.n_ctx, runner.n_ctx_seq, cfg.n_seq_max,
                                    cfg.max_output_tokens)
        self.publish: Publish = lambda batch: None
        self._inbox: queue.SimpleQueue[Request | EmbedJob | _Cancel | _CancelAll | _Wake
                                       | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.alive = False
        self.failure: str | None = None
        # a backend holding part of the model is gone (RPC server): see backend_down
        self.backend_failure: str | None = None
        self._down_lock = threading.Lock()
        self._step_lock = threading.Lock()  # held by the engine thread while it runs a turn
        self._pending: list[tuple[Request, Delta]] = []  # the turn's output, not yet published
        self._kv_gauge_at = 0.0  # when llamaserve_kv_cells_used was last set (perf_counter)
        self.metrics.seqs_total.set(runner.n_seq_max)
        self.metrics.kv_cells_total.set(runner.n_ctx)
        self.metrics.bind(lambda: len(self.scheduler.running),
                          lambda: len(self.scheduler.waiting))
        self.metrics.bind_grammar_checks(runner.grammar_checker.stats)
        if runner.samplers.backend is not None:
            self.metrics.bind_backend_sampling(runner.samplers.backend)

    # -- called from any thread ---------------------------------------------------
    def start(self, publish: Publish) -> None:
        self.publish = publish
        self._thread = threading.Thread(target=self._run, name="llamaserve-engine", daemon=True)
        self.alive = True
        self.metrics.engine_alive.set(1)
        self._thread.start()
        if self.runner.rpc is not None:
            for endpoint in self.runner.rpc.endpoints:
                self.metrics.rpc_up.labels(endpoint).set(1)
            self.runner.rpc.watch(self.backend_down)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._inbox.put(None)
        rpc = self.runner.rpc
        if rpc is not None:
            rpc.unwatch()
        broken = self.backend_failure is not None or (rpc is not None and rpc.broken)
        if self._thread is not None:
            self._thread.join(1.0 if broken else timeout)  # may be stuck in llama.cpp
        if broken:  # what lives on a dead server cannot be freed: it would wait on it
            log.warning("not freeing the model's llama.cpp state: its backend failed")
            if self.disk is not None:
                self.disk.close(timeout)
            if self.media_cache is not None:
                self.media_cache.close()
            return
        if self.disk is not None:
            if self._thread is None or not self._thread.is_alive():
                self.cache.save_all()  # the cached sequences, so the next start is warm
            self.disk.close(timeout)
        if self.embedder is not None:
            self.embedder.close()
        if self.drafting is not None:
            self.drafting.close()
        if self.media_cache is not None:
            self.media_cache.close()
        if self.projector is not None:
            self.projector.close()

    def max_new_tokens(self, prompt_len: int, max_tokens: int | None, *,
                       clamp: bool = False) -> int:
        """Admission check for one sequence (``engine.admission``)."""
        return self.limits.max_new_tokens(prompt_len, max_tokens, clamp=clamp)

    def submit(self, request: Request) -> None:
        if not self.alive:
            raise self._unavailable()
        request.t_submit = time.monotonic()
        self._inbox.put(request)

    def cancel_all(self) -> None:
        self._inbox.put(_CancelAll())

    def submit_embed(self, job: EmbedJob) -> None:
        if not self.alive:
            raise self._unavailable()
        self._inbox.put(job)

    def _unavailable(self) -> EngineError:
        if self.backend_failure is not None:
            return BackendUnavailable(self.backend_failure)
        return EngineError(f"engine is not running: {self.failure or 'stopped'}")

    def backend_down(self, reason: str, endpoints: tuple[str, ...] = (),
                     grace: float = 2.0) -> None:
        """A backend holding part of the model is gone (an RPC server died); from any
        thread, once. New requests get BackendUnavailable at once; the engine thread fails
        what it holds at its next turn. If it is not between turns within ``grace``
        seconds it is stuck inside llama.cpp waiting on the dead server, and the calling
        thread fails everything in its place (without touching llama.cpp)."""
        with self._down_lock:
            if self.backend_failure is not None:
                return
            self.backend_failure = reason
        for endpoint in endpoints:
            self.metrics.rpc_up.labels(endpoint).set(0)
        self.failure = reason
        self.alive = False
        self.metrics.engine_alive.set(0)
        self._inbox.put(_Wake())
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if thread is not threading.current_thread() and self._step_lock.acquire(timeout=grace):
            self._step_lock.release()  # between turns: it sees backend_failure itself
            return
        log.error("the engine thread is stuck in llama.cpp; failing its requests from %s",
                  threading.current_thread().name)
        publish, self.publish = self.publish, lambda batch: None  # it stays quiet if it returns
        publish(self._fail_all(BackendUnavailable(reason), list(self._pending),
                               touch_state=False))

    def cancel(self, request: Request) -> None:
        if request.status is not Status.FINISHED and not request.cancelled:
            request.cancelled = True
            self._inbox.put(_Cancel(request))

    # -- engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        out: list[tuple[Request, Delta]] = []
        try:
            while not self._stopping:
                out = self._pending = []
                idle = not (self.scheduler.has_work or self.embeds)
                if idle and self._kv_gauge_at:  # exact while nothing runs
                    self._kv_gauge_at = 0.0
                    self.metrics.kv_cells_used.set(self.cache.cells_used())
                self._drain_inbox(out, block=idle)
                with self._step_lock:
                    if self.backend_failure is not None:
                        raise BackendUnavailable(self.backend_failure)
                    if self.embeds and not self._stopping:  # one batch, then generation
                        assert self.embedder is not None
                        self.embedder.run_batch(self.embeds, self.metrics)
                    if self.scheduler.has_work and not self._stopping:
                        self._step(out)
                if out:
                    self.publish(out)
                    out = self._pending = []
        except BaseException as exc:  # the loop itself broke: report, fail everyone
            if isinstance(exc, BackendUnavailable):
                self.publish(self._fail_all(exc, out, touch_state=False))
                return
            log.exception("engine thread died")
            self.failure = f"{type(exc).__name__}: {exc}"
            self.publish(self._fail_all(EngineError("engine thread died"), out))
            return
        self.alive = False
        self.metrics.engine_alive.set(0)

    def _fail_all(self, error: EngineError, out: list[tuple[Request, Delta]],
                  touch_state: bool = True) -> list[tuple[Request, Delta]]:
        """Fail every request and embedding job the engine holds or has queued; returns
        ``out`` with their deltas, to publish. Without ``touch_state`` nothing of
        llama.cpp (sequences, samplers) is touched: its backend is gone."""
        self.failure = self.failure or str(error)
        self.alive = False
        self.metrics.engine_alive.set(0)
        pending = [*self.scheduler.running, *self.scheduler.waiting]
        jobs = list(self.embeds.jobs)
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, Request):
                item.status = Status.FINISHED
                pending.append(item)
            elif isinstance(item, EmbedJob):
                jobs.append(item)
        for job in jobs:
            job.done(None, error)
        for r in pending:
            if touch_state:
                try:
                    self.delivery.fail(r, error, out)
                    continue
                except Exception:  # state may be broken: still tell the waiting client
                    pass
            r.status = Status.FINISHED
            out.append((r, Delta(index=r.index, error=error, finish_reason="error",
                                 prompt_tokens=r.n_prompt,
                                 completion_tokens=len(r.output))))
        return out

    def _drain_inbox(self, out: list[tuple[Request, Delta]], block: bool) -> None:
        if not block and self._inbox.empty():
            return  # (most steps: cheaper than catching queue.Empty)
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return
        while True:
            if isinstance(item, EmbedJob):
                self.embeds.add(item)
            elif isinstance(item, Request):
                if item.cancelled:
                    item.status = Status.FINISHED
                    self.delivery.finish(item, "cancelled", out)
                else:
                    self.scheduler.add(item)
            elif isinstance(item, _Cancel) and item.request.status is not Status.FINISHED:
                self.delivery.finish(item.request, "cancelled", out)
            elif isinstance(item, _CancelAll):
                for r in [*self.scheduler.running, *self.scheduler.waiting]:
                    r.cancelled = True
                    self.delivery.finish(r, "cancelled", out)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _step(self, out: list[tuple[Request, Delta]]) -> None:
        started = time.perf_counter()
        self.delivery.expire(out)
        if not self.scheduler.has_work:
            return
        if self.drafting is not None:
            self.drafting.propose(self.scheduler.running)
        else:
            propose_forced(self.scheduler.running, self.runner)
        if self.projector is not None:
            self._encode_media(out)
        plan = self.scheduler.schedule()
        now = time.monotonic()
        for r in plan.admitted:
            if not r.suspensions:
                self.metrics.queue_seconds.observe(now - r.t_submit)
        if plan.suspended:
            self.metrics.suspended.inc(len(plan.suspended))
        for r in plan.preempted:
            self.delivery.finish(r, "length", out)
        if plan.items:
            decode_started = time.perf_counter()
            try:
                self._execute(plan, out)
            except Exception as exc:
                log.exception("engine step failed; failing %d request(s)", len(plan.items))
                self.metrics.step_failures.inc()
                error = EngineError(f"{type(exc).__name__}: {exc}")
                for item in plan.items:
                    self.delivery.fail(item.request, error, out)
            now = time.perf_counter()
            n_tokens = plan.num_tokens
            self.metrics.step_seconds.observe(now - started)
            self.metrics.batch_tokens.observe(n_tokens)
            if self.step_budget is not None:
                prefill = sum(len(item.tokens) for item in plan.items
                              if item.pos < len(item.request.prompt))
                self._observe_budget(n_tokens - prefill, prefill, now - decode_started)
            # decode steps only: prefill chunks are cheaper per token than drafted tokens
            if self.drafting is not None and all(
                    item.pos >= len(item.request.prompt) for item in plan.items):
                self.drafting.observe_step(n_tokens, now - decode_started)
        if started - self._kv_gauge_at >= KV_GAUGE_PERIOD:  # walking the ledger costs a
            self._kv_gauge_at = started  # few µs a step; a scrape sees it at most this old
            self.metrics.kv_cells_used.set(self.cache.cells_used())

    def _observe_budget(self, decode: int, prefill: int, seconds: float) -> None:
        budget = self.step_budget
        assert budget is not None
        budget.observe(decode, prefill, seconds)
        if decode and prefill:
            cost = budget.prefill_cost()
            base = budget.decode_seconds(decode)
            if cost is not None and base is not None:
                self.metrics.prefill_token_seconds.set(cost)
                self.metrics.decode_step_seconds.set(base)
                self.metrics.prefill_budget.set(budget.last)

    def _encode_media(self, out: list[tuple[Request, Delta]]) -> None:
        """Give the media the next prefill chunks start in their embeddings: from the cache,
        or by running the projector's encoder on at most one media per step (the step's
        decode still follows, so other requests' streams keep flowing)."""
        assert self.projector is not None and self.media_cache is not None
        encoded = False
        for r in list(self.scheduler.running):
            span = r.pending_media
            if span is None:
                continue
            rows = self.media_cache.get(span.key)
            if rows is None:
                if encoded:
                    continue
                started = time.perf_counter()
                try:
                    rows = self.projector.encode(span)
                except Exception as exc:
                    log.exception("media encoding failed (request %d)", r.id)
                    self.metrics.step_failures.inc()
                    self.delivery.fail(r, EngineError(f"media encoding failed: {exc}"), out)
                    continue
                self.metrics.media_encode_seconds.observe(time.perf_counter() - started)
                self.media_cache.put(span.key, rows)
                encoded = True
            else:
                self.metrics.media_cache_hits.inc()
            span.embd = rows
            self.projector.release(span)

    def _verify(self, item: BatchItem, last_index: int, out: list[tuple[Request, Delta]]) -> None:
        """Sample every drafted position with the request's own sampler; keep tokens while
        they equal the draft, drop the rest from the KV, emit what was accepted."""
        r, draft = item.request, item.tokens[1:]
        first = last_index - len(draft)
        if not self._ensure_sampler(r, out):
            return
        done = len(r.output)

        def stop_after(j: int, token: int) -> bool:
            eog = self.runner.vocabulary.is_eog(token) and not r.params.ignore_eos
            return eog or done + j + 1 >= r.max_new_tokens

        sample = DraftSampler(self.runner, r, draft, first)
        tokens = verify(draft, sample, stop_after)
        if sample.taken:
            self.metrics.forced_tokens.inc(sample.taken)
        kept = len(tokens) - 1
        r.num_computed = item.pos + 1 + kept
        self.cache.trim(r, r.num_computed)
        if self.drafting is not None:
            self.drafting.verified(r, len(draft), tokens)
        for j, token in enumerate(tokens):
            if not self.delivery.emit(r, token, first + j, out):
                return

    def _execute(self, plan: StepPlan, out: list[tuple[Request, Delta]]) -> None:
        if self.runner.adapters:
            self.runner.set_adapters(plan.adapters)
        if self.runner.samplers.backend is not None:  # sampled in the decode: chains first
            for item in plan.items:
                if item.logits and item.request.sampler is None and not item.request.params.grammar:
                    self._ensure_sampler(item.request, out)
        status, last_index = self.runner.decode(plan.items)
        if status == DECODE_NO_KV_SLOT:
            victim = max((i.request for i in plan.items), key=lambda r: r.id)
            log.warning("KV cache full; ending the youngest sequence (request %d)", victim.id)
            self.scheduler.remove(victim, keep_kv=False)
            self.delivery.finish(victim, "length", out)
            return
        if status != 0:
            raise EngineError(f"llama_decode returned {status}")
        self.scheduler.commit(plan)
        if self.drafting is not None:
            self.drafting.absorb(plan.items)
        prompt_tokens = 0
        for item, index in zip(plan.items, last_index, strict=True):
            r = item.request
            if item.pos < len(r.prompt):
                prompt_tokens += len(item.tokens)
                if r.num_computed == len(r.prompt):
                    self.cache.prefill_done(r)
                    if r.media and log.isEnabledFor(logging.DEBUG):
                        log.debug("request %d prefilled: %d prompt tokens (KV cells), media "
                                  "at positions %s, next position %d", r.id, len(r.prompt),
                                  [r.positions.next(m.start) for m in r.media],
                                  r.positions.next(len(r.prompt)))
            if r.params.prompt_logprobs and not r.output:
                self.delivery.prompt_logprobs(item, index)
            if item.n_draft and r.forced_unsampled and r.status is Status.RUNNING:
                if take_forced(item, index, self.runner, self.delivery, self.cache, out):
                    self._sample(r, index, out)
            elif item.n_draft and r.status is Status.RUNNING:
                self._verify(item, index, out)
            elif item.logits and r.status is Status.RUNNING:
                self._sample(r, index, out)
                if self.drafting is not None and r.draft_state is not None and r.output:
                    self.drafting.verified(r, 0, r.output[-1:])
        if prompt_tokens:
            self.metrics.prompt_tokens.inc(prompt_tokens)

    def _ensure_sampler(self, r: Request, out: list[tuple[Request, Delta]]) -> bool:
        if r.sampler is None:
            try:
                r.sampler = self.runner.new_sampler(r.params, r.prompt, r.seq_id)
            except ValueError as exc:  # only this request's sampler is at fault
                self.delivery.fail(r, EngineError(str(exc)), out)
                return False
            r.detok = IncrementalDetokenizer(r.params.stop)
        return True

    def _sample(self, r: Request, index: int, out: list[tuple[Request, Delta]]) -> None:
        if not self._ensure_sampler(r, out):
            return
        forced = r.reasoning.forced() if r.reasoning is not None else None
        if forced is None:
            token = self.runner.sample(r.sampler, index)
        else:  # the thinking budget is spent: its end marker, seen by grammar and penalties
            token = forced
            self.runner.accept(r.sampler, token)
        self.delivery.emit(r, token, index, out)

