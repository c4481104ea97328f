"""Prometheus metrics of the engine (one registry per engine, so tests can run several).

The series the engine thread updates at every token or step (generated and prompt tokens,
time to first token, inter-token time, step time, batch size) are ``StepCounter`` and
``StepHistogram``: plain numbers only that thread writes, read when ``/metrics`` is
scraped. prometheus_client's own take a lock and check their state on every call (~1 µs
an increment, ~2 µs an observation, against ~0.1 and ~0.3 µs), a cost paid per token.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector


class StepCounter(Collector):
    """A counter one thread increments (no lock: a scrape reads a value at most a step
    old). Exposed like prometheus_client's (``NAME_total``), without ``_created``."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class StepHistogram(Collector):
    """A histogram one thread observes into (bucket counts in a list, no lock)."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = (*sorted(float(b) for b in buckets), math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total, running = list(self.counts), self.sum, 0
        buckets = []
        for bound, n in zip(self.bounds, counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == math.inf else repr(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                    sum_value=total)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests_running = Gauge(
            "llamaserve_requests_running", "Sequences currently scheduled on the engine.",
            registry=r)
        self.requests_waiting = Gauge(
            "llamaserve_requests_waiting", "Sequences waiting for a free sequence id.",
            registry=r)
        self.seqs_in_use = Gauge(
            "llamaserve_sequences_in_use", "llama.cpp sequence ids holding a request.",
            registry=r)
        self.seqs_total = Gauge(
            "llamaserve_sequences_total", "llama.cpp sequence ids available (n_seq_max).",
            registry=r)
        self.prompt_tokens = StepCounter(
            "llamaserve_prompt_tokens",
            "Prompt tokens evaluated by llama_decode (not reused from a cache).", r)
        self.prompt_tokens_cached = Counter(
            "llamaserve_prompt_tokens_cached",
            "Prompt tokens reused from the prefix cache instead of evaluated, by source.",
            ["source"], registry=r)
        self.kv_cells_used = Gauge(
            "llamaserve_kv_cells_used",
            "KV cells held by running and cached sequences (shared cells count once).",
            registry=r)
        self.kv_cells_total = Gauge(
            "llamaserve_kv_cells_total", "KV cells in the context (n_ctx).", registry=r)
        self.disk_hits = Counter(
            "llamaserve_disk_cache_hits", "Sequence states loaded from the disk cache.",
            registry=r)
        self.disk_saves = Counter(
            "llamaserve_disk_cache_saves", "Sequence states written to the disk cache.",
            registry=r)
        self.disk_dropped = Counter(
            "llamaserve_disk_cache_dropped",
            "Saves skipped because the entry exceeds max_bytes or the writer is behind.",
            registry=r)
        self.disk_write_errors = Counter(
            "llamaserve_disk_cache_write_errors",
            "Saves skipped because writing failed (disk full, read-only directory, ...), "
            "by errno name.", ["reason"], registry=r)
        self.slow_clients = Counter(
            "llamaserve_slow_client_cancels",
            "Sequences cancelled because their client stopped reading and the output held "
            "for it reached server.max_buffered_steps.", registry=r)
        self.schema_mismatches = Counter(
            "llamaserve_schema_mismatches",
            "Answers that ended normally but broke their JSON schema (a response format's "
            "or a tool's parameters), by kind (format, tool) and strict (true, false).",
            ["kind", "strict"], registry=r)
        self.disk_evictions = Counter(
            "llamaserve_disk_cache_evictions", "Entries deleted to stay under max_bytes.",
            registry=r)
        self.disk_rejected = Counter(
            "llamaserve_disk_cache_rejected",
            "Files deleted as incompatible (other model/build/layout) or corrupt.",
            ["reason"], registry=r)
        self.disk_entries = Gauge(
            "llamaserve_disk_cache_entries", "Entries in the disk cache.", registry=r)
        self.disk_bytes = Gauge(
            "llamaserve_disk_cache_bytes", "Bytes used by the disk cache.", registry=r)
        self.parked_bytes = Gauge(
            "llamaserve_parked_sequence_bytes",
            "Bytes of idle sequences parked in RAM out of the KV pool "
            "(model.parked_max_bytes).", registry=r)
        self.parked_sequences = Gauge(
            "llamaserve_parked_sequences", "Idle sequences parked in RAM.", registry=r)
        self.parked_restored = Counter(
            "llamaserve_parked_sequences_restored",
            "Parked sequences brought back into the KV pool for a prompt sharing a prefix.",
            registry=r)
        self.snapshot_bytes = Gauge(
            "llamaserve_state_snapshot_bytes",
            "Bytes of recurrent-state snapshots held in RAM (model.state_snapshots_max_bytes).",
            registry=r)
        self.snapshots_taken = Counter(
            "llamaserve_state_snapshots_taken",
            "Recurrent-state snapshots taken during prefill.", registry=r)
        self.snapshots_restored = Counter(
            "llamaserve_state_snapshots_restored",
            "Recurrent-state snapshots restored to reuse part of a cached sequence, by source.",
            ["source"], registry=r)
        self.snapshot_tokens_reused = Counter(
            "llamaserve_state_snapshot_tokens_reused",
            "Prompt tokens reused through a restored recurrent-state snapshot.", registry=r)
        self.snapshots_evicted = Counter(
            "llamaserve_state_snapshots_evicted",
            "Snapshots dropped to stay under model.state_snapshots_max_bytes.", registry=r)
        self.snapshots_failed = Counter(
            "llamaserve_state_snapshots_failed",
            "Snapshots that could not be taken or restored (dropped; the prompt is evaluated).",
            registry=r)
        self.embed_inputs = Counter(
            "llamaserve_embedding_inputs", "Inputs embedded.", registry=r)
        self.embed_tokens = Counter(
            "llamaserve_embedding_tokens", "Tokens evaluated for embeddings.", registry=r)
        self.embed_batch_seconds = Histogram(
            "llamaserve_embedding_batch_seconds", "Wall time of one embedding batch.",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5), registry=r)
        self.generated_tokens = StepCounter(
            "llamaserve_generated_tokens", "Tokens generated.", r)
        self.finished = Counter(
            "llamaserve_sequences_finished", "Sequences ended, by finish reason.",
            ["reason"], registry=r)
        self.prefill_budget = Gauge(
            "llamaserve_prefill_budget_tokens",
            "Prompt tokens the last mixed step could take (model.prefill_step_target).",
            registry=r)
        self.prefill_token_seconds = Gauge(
            "llamaserve_prefill_token_seconds",
            "Measured seconds one prompt token adds to a step that also decodes.", registry=r)
        self.decode_step_seconds = Gauge(
            "llamaserve_decode_step_seconds",
            "Measured decode-only step time at the last mixed step's decode size.", registry=r)
        self.step_seconds = StepHistogram(
            "llamaserve_engine_step_seconds", "Wall time of one engine step.",
            (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5), r)
        latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.queue_seconds = Histogram(
            "llamaserve_queue_seconds", "Time from submission to getting a sequence.",
            buckets=latency, registry=r)
        self.ttft_seconds = StepHistogram(
            "llamaserve_time_to_first_token_seconds", "Time from submission to the first token.",
            latency, r)
        self.itl_seconds = StepHistogram(
            "llamaserve_inter_token_seconds", "Time between consecutive tokens of a sequence.",
            (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5), r)
        self.e2e_seconds = Histogram(
            "llamaserve_request_seconds", "Time from submission to the last token.",
            buckets=latency, registry=r)
        self.batch_tokens = StepHistogram(
            "llamaserve_engine_batch_tokens", "Tokens in one llama_decode.",
            (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048), r)
        self.suspended = Counter(
            "llamaserve_sequences_suspended", "Background (batch) sequences that gave their "
            "sequence up to a waiting interactive request.", registry=r)
        self.timeouts = Counter(
            "llamaserve_request_timeouts", "Sequences ended by server.request_timeout.",
            registry=r)
        self.drafts = Counter(
            "llamaserve_drafts", "Draft proposals verified (one per sequence and step).",
            registry=r)
        self.draft_tokens = Counter(
            "llamaserve_draft_tokens_proposed", "Draft tokens proposed.", registry=r)
        self.draft_accepted = Counter(
            "llamaserve_draft_tokens_accepted", "Draft tokens accepted by verification.",
            registry=r)
        self.forced_tokens = Counter(
            "llamaserve_grammar_forced_tokens", "Tokens a grammar forced, taken without "
            "sampling (decoded beside the token before them).", registry=r)
        self.draft_acceptance = Gauge(
            "llamaserve_draft_acceptance_rate", "Accepted / proposed draft tokens (cumulative).",
            registry=r)
        self.draft_mean_accepted = Gauge(
            "llamaserve_draft_mean_accepted_length", "Accepted tokens per draft (cumulative).",
            registry=r)
        self.draft_acceptance.set_function(
            lambda: self.draft_accepted._value.get() / max(self.draft_tokens._value.get(), 1))
        self.draft_mean_accepted.set_function(
            lambda: self.draft_accepted._value.get() / max(self.drafts._value.get(), 1))
        self.media_encode_seconds = Histogram(
            "llamaserve_media_encode_seconds", "Projector encodes of one image or audio chunk.",
            buckets=(0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.media_cache_hits = Counter(
            "llamaserve_media_cache_hits", "Media whose embeddings came from the cache.",
            registry=r)
        self.step_failures = Counter(
            "llamaserve_engine_step_failures", "Engine steps that raised an error.", registry=r)
        self.engine_alive = Gauge(
            "llamaserve_engine_alive", "1 while the engine thread is serving.", registry=r)
        self.rpc_up = Gauge(
            "llamaserve_rpc_server_up",
            "1 while the model's connection to this RPC server (model.rpc_servers) is up.",
            ["endpoint"], registry=r)

    def bind_grammar_checks(self, stats: Any) -> None:
        """The grammar checker's counts (``engine.sampling.grammar_check.CheckStats``)."""
        self.registry.register(_GrammarChecks(stats))

    def bind_backend_sampling(self, backend: Any) -> None:
        """Counts of ``engine.sampling.backend.BackendSampling`` (model.backend_sampling)."""
        self.registry.register(_BackendSampling(backend))

    def bind(self, running: Callable[[], float], waiting: Callable[[], float]) -> None:
        self.requests_running.set_function(running)
        self.seqs_in_use.set_function(running)
        self.requests_waiting.set_function(waiting)


class _GrammarChecks(Collector):
    """``llamaserve_grammar_checks{outcome}``: grammars parsed by the checker process, found
    in its cache, or that crashed it or timed it out (each of those a 400)."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "llamaserve_grammar_checks", "Grammars checked by llama.cpp in the grammar "
            "checker process before the engine uses them, by outcome.", labels=["outcome"])
        s = self.stats
        for outcome, value in (("parsed", s.checked - s.crashed - s.timed_out),
                               ("cached", s.cached), ("crashed", s.crashed),
                               ("timed_out", s.timed_out)):
            family.add_metric([outcome], value)
        yield family


class _BackendSampling(Collector):
    """Tokens llama.cpp sampled in its graph, and chains attached or detached there."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "llamaserve_backend_sampled_tokens", "Tokens sampled inside llama.cpp's graph "
            "(model.backend_sampling).", value=self.backend.sampled)
        yield CounterMetricFamily(
            "llamaserve_backend_sampler_changes", "Sampler chains attached to or detached "
            "from a sequence in llama.cpp (each rebuilds the next decode's graph).",
            value=self.backend.changes)
        yield CounterMetricFamily(
            "llamaserve_backend_sampler_reuses", "Idle sampler chains a new request took "
            "over in llama.cpp (no graph rebuilt).", value=self.backend.reused)
