"""Delivery: what becomes of a sampled token, and how a request ends.

A token goes into the request's output and its text through the incremental
detokenizer; end of generation, a stop string, ``max_tokens`` and the deadline end the
request; each step's results become ``Delta``s for the API (held back and joined into one
for a response that is not streamed). The engine thread calls these; nothing here calls
``llama_decode``.
"""

from __future__ import annotations

import time

from engine.media.projector import Projector
from engine.metrics import EngineMetrics
from engine.request import Delta, EngineError, Request, RequestTimeout, Status, TokenLogprob
from engine.runner import Runner
from engine.scheduler import BatchItem, Scheduler

Out = list[tuple[Request, Delta]]


class Delivery:
    def __init__(self, runner: Runner, scheduler: Scheduler, metrics: EngineMetrics) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.metrics = metrics
        # special tokens a response parser needs as text (e.g. a tool-call marker); other
        # control tokens are never rendered
        self.render_special: frozenset[int] = frozenset()

    def prompt_logprobs(self, item: BatchItem, last_index: int) -> None:
        """The logprobs of a prefill chunk's prompt tokens (``prompt_logprobs``)."""
        r, first = item.request, last_index - len(item.tokens) + 1
        if item.pos == 0:
            r.prompt_logprobs.append(None)  # nothing predicts the first token
        top = r.params.logprobs or 0
        for j in range(len(item.tokens)):
            nxt = item.pos + j + 1
            if nxt < len(r.prompt):
                r.prompt_logprobs.append(self.runner.logprob(first + j, r.prompt[nxt], top))

    def emit(self, r: Request, token: int, index: int,
              out: list[tuple[Request, Delta]]) -> bool:
        """Deliver one generated token; False once the request has finished."""
        r.output.append(token)
        self.metrics.generated_tokens.inc()
        now = time.monotonic()
        if len(r.output) == 1:
            self.metrics.ttft_seconds.observe(now - r.t_submit)
        else:
            self.metrics.itl_seconds.observe(now - r.t_last)
        r.t_last = now
        delta = Delta(index=r.index, token_ids=[token], completion_tokens=len(r.output),
                      prompt_tokens=r.n_prompt, cached_tokens=r.cached_tokens)
        if len(r.output) == 1 and r.params.prompt_logprobs:
            delta.prompt_logprobs = r.prompt_logprobs
        if r.params.logprobs is not None:
            lp: TokenLogprob = self.runner.logprob(index, token, r.params.logprobs)
            delta.logprobs = [lp]
        assert r.detok is not None
        if self.runner.vocabulary.is_eog(token) and not r.params.ignore_eos:
            delta.text = r.detok.flush()
            delta.token_ids = []
            delta.logprobs = None
            self.finish(r, "stop", out, delta)
            return False
        if r.reasoning is not None and not r.reasoning.closed:
            r.reasoning.saw(self.runner.vocabulary.piece(token, True).decode("utf-8", "replace"))
        delta.text = r.detok.feed(self.runner.vocabulary.piece(token, token in self.render_special))
        if r.detok.stopped:
            delta.stop_sequence = r.detok.matched
            self.finish(r, "stop", out, delta)
            return False
        if len(r.output) >= r.max_new_tokens:
            delta.text += r.detok.flush()
            self.finish(r, "length", out, delta)
            return False
        if r.whole:
            r.held.append(delta)
        else:
            out.append((r, delta))
        return True

    def finish(self, r: Request, reason: str, out: list[tuple[Request, Delta]],
                delta: Delta | None = None, keep_kv: bool = True) -> None:
        if r.status is not Status.FINISHED:
            self.scheduler.remove(r, keep_kv)
        for span in r.media:  # the chunks and embeddings are not needed any more
            Projector.release(span)
            span.embd = None
        self.runner.free_sampler(r.sampler)
        r.sampler = None
        r.finish_reason = reason
        self.metrics.finished.labels(reason).inc()
        if r.t_submit:
            self.metrics.e2e_seconds.observe(time.monotonic() - r.t_submit)
        if delta is None:
            delta = Delta(index=r.index, prompt_tokens=r.n_prompt,
                          completion_tokens=len(r.output), cached_tokens=r.cached_tokens)
            if r.detok is not None and reason == "length":
                delta.text = r.detok.flush()
        delta.finish_reason = reason
        if r.held:
            r.held.append(delta)
            delta, r.held = Delta.joined(r.held), []
        out.append((r, delta))

    def fail(self, r: Request, error: EngineError, out: list[tuple[Request, Delta]]) -> None:
        delta = Delta(index=r.index, error=error, prompt_tokens=r.n_prompt,
                      completion_tokens=len(r.output))
        self.finish(r, "error", out, delta, keep_kv=False)

    def expire(self, out: list[tuple[Request, Delta]]) -> None:
        """End requests past server.request_timeout: before their first token with a
        timeout error, after it like max_tokens (flagged)."""
        now = time.monotonic()
        for r in [*self.scheduler.running, *self.scheduler.waiting]:
            if r.deadline is None or now < r.deadline:
                continue
            self.metrics.timeouts.inc()
            if r.output:
                delta = Delta(index=r.index, prompt_tokens=r.n_prompt,
                              completion_tokens=len(r.output), cached_tokens=r.cached_tokens,
                              timed_out=True)
                if r.detok is not None:
                    delta.text = r.detok.flush()
                self.finish(r, "length", out, delta)
            else:
                self.fail(r, RequestTimeout("the request timed out before its first token"),
                           out)
