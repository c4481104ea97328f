"""Per-request state shared by the scheduler, the runner and the engine loop."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from engine.detokenizer import IncrementalDetokenizer
from engine.media.spans import IDENTITY, MediaSpan, PositionMap, reusable, segment_end, span_at
from engine.sampling.reasoning import ReasoningBudget, ReasoningGuard


@dataclass(frozen=True)
class SamplingParams:
    """What a client asked for, already validated and resolved (seed is concrete)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    seed: int = 0
    seeded: bool = True  # the client chose the seed (False: drawn for it at random)
    logit_bias: tuple[tuple[int, float], ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: off; k >= 0: chosen token plus k alternatives
    prompt_logprobs: bool = False  # logprobs of the prompt tokens too (completions echo)
    ignore_eos: bool = False
    cache_prompt: bool = True  # reuse a cached prefix (llama-server's per-request switch)
    grammar: str | None = None  # GBNF constraining the output
    grammar_triggers: tuple[str, ...] = ()  # lazy grammar: constrain from a pattern's match
    # the prompt opened a reasoning block with a budget: closed by the engine when spent
    reasoning: ReasoningBudget | None = None

    @property
    def greedy(self) -> bool:
        """Temperature 0, or so small that llama.cpp's logit / temperature overflows to
        infinity (and samples garbage): the highest logit either way."""
        return self.temperature < 1e-30

    @property
    def penalized(self) -> bool:
        return (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Delta:
    """One step's worth of output for one request, handed to its consumer."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    timed_out: bool = False  # ended by server.request_timeout
    stop_sequence: str | None = None  # the stop string that ended it (finish "stop")
    error: EngineError | None = None

    @staticmethod
    def joined(deltas: list[Delta]) -> Delta:
        """One delta with what several consecutive ones of a request carried (the output
        of a request whose consumer reads only the finished result)."""
        last = deltas[-1]
        logprobs = [lp for d in deltas if d.logprobs for lp in d.logprobs]
        return Delta(
            index=last.index, text="".join(d.text for d in deltas),
            token_ids=[t for d in deltas for t in d.token_ids],
            logprobs=logprobs if any(d.logprobs is not None for d in deltas) else None,
            prompt_logprobs=next((d.prompt_logprobs for d in deltas
                                  if d.prompt_logprobs is not None), None),
            finish_reason=last.finish_reason,
            prompt_tokens=max(d.prompt_tokens for d in deltas),
            completion_tokens=last.completion_tokens,
            cached_tokens=max(d.cached_tokens for d in deltas),
            timed_out=any(d.timed_out for d in deltas),
            stop_sequence=next((d.stop_sequence for d in reversed(deltas)
                                if d.stop_sequence), None),
            error=last.error)


class EngineError(Exception):
    """An engine-side failure delivered to a request (maps to an HTTP 500)."""


class RequestTimeout(EngineError):
    """The request's deadline passed before its first token (maps to an HTTP 408)."""


class BackendUnavailable(EngineError):
    """A backend holding part of the model (an RPC server) is gone; the engine stopped
    (maps to an HTTP 503)."""


BACKGROUND = 1  # Request.priority of batch lines: admitted after every waiting 0
_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """A single sequence of generation (one choice of one HTTP request)."""

    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    consumer: Any = None  # opaque to the engine: where Deltas go (set by the API layer)
    index: int = 0
    id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    seq_id: int = -1
    num_computed: int = 0  # tokens of prompt + output already in the KV cache
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache, not evaluated
    # prompt positions where prefill ends a chunk so the cache snapshots the recurrent state
    snapshot_at: list[int] = field(default_factory=list)
    # prompt positions where a message's text ends without an end-of-generation token after
    # it (a system prompt the template folds into the first user turn), set by the API: the
    # cache snapshots there as at message ends
    message_ends: tuple[int, ...] = ()
    output: list[int] = field(default_factory=list)
    cancelled: bool = False
    finish_reason: str | None = None
    sampler: Any = None  # runner-owned handle
    detok: IncrementalDetokenizer | None = None
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)  # tokens proposed for this step
    forced: int = 0  # how many of them the grammar forces (engine.drafts.forced)
    draft_state: Any = None  # engine.drafts.policy.DraftState, created when drafting starts
    deadline: float | None = None  # time.monotonic() after which the request is ended
    t_submit: float = 0.0  # monotonic times for the latency metrics
    t_last: float = 0.0
    media: tuple[MediaSpan, ...] = ()  # images / audio in the prompt, in order
    adapters: tuple[tuple[str, float], ...] = ()  # LoRA (name, scale), sorted; () = base
    # prompt index -> KV position (M-RoPE media take fewer positions than tokens)
    positions: PositionMap = IDENTITY
    priority: int = 0  # admission order: lower first (interactive 0, batch BACKGROUND)
    reasoning: ReasoningGuard | None = None  # an open reasoning block with a budget
    # the consumer reads only the finished result (a response that is not streamed): the
    # engine holds the output and hands it over once, with the end, instead of each step
    whole: bool = False
    held: list[Delta] = field(default_factory=list)
    n_prompt: int = -1  # the prompt's length as it came (usage); set from ``prompt``
    folded: int = 0  # output tokens moved into ``prompt`` by ``suspend``
    suspensions: int = 0  # times it gave its sequence up (its reuse then is its own work)

    def __post_init__(self) -> None:
        if self.n_prompt < 0:
            self.n_prompt = len(self.prompt)
        if self.media:
            self.positions = PositionMap.of(self.media)
        if self.params.reasoning is not None:
            self.reasoning = ReasoningGuard(self.params.reasoning)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output) - self.folded

    @property
    def new_output(self) -> list[int]:
        """The output after the prompt: what ``suspend`` did not move into it."""
        return self.output[self.folded:] if self.folded else self.output

    def suspend(self) -> None:
        """The request gave up its sequence (a waiting interactive request needed it) and
        waits to be admitted again. Its output so far joins the prompt, so admission finds
        prompt + output in the prefix cache (the sequence it left holds all but the last
        sampled token, unless another request took it since) and evaluates only that token,
        whose logits give the next one: what the next decode would have done. The sampler,
        detokenizer and budget stay as they are."""
        self.prompt = [*self.prompt, *self.new_output]
        self.folded = len(self.output)
        self.suspensions += 1
        self.seq_id = -1
        self.num_computed = 0
        self.snapshot_at = []
        self.draft, self.forced = [], 0
        self.draft_state = None  # prompt lookup indexes the prompt once

    @property
    def forced_unsampled(self) -> bool:
        """This step's draft is tokens the grammar forces, taken without their logits (no
        logprobs asked for): only the position after them is read (engine.drafts.forced)."""
        return self.forced > 0 and self.params.logprobs is None

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.prompt)

    def next_tokens(self, budget: int) -> list[int]:
        """Tokens to feed next: a prompt chunk (all text or all one media), or the last
        sampled token."""
        if not self.prefill_done:
            end = self.num_computed + budget
            if self.media:
                end = min(end, segment_end(self.media, self.num_computed, len(self.prompt)))
            return self.prompt[self.num_computed : end]
        return [self.output[-1]]

    @property
    def pending_media(self) -> MediaSpan | None:
        """The media the next prefill chunk starts in, while it has no embeddings yet."""
        if not self.media or self.prefill_done:
            return None
        span = span_at(self.media, self.num_computed)
        return span if span is not None and span.embd is None else None

    def next_tokens_fit(self, chunk: list[int]) -> bool:
        """False when ``chunk`` cuts a media that must be evaluated whole."""
        span = span_at(self.media, self.num_computed)
        return span is None or not span.whole or self.num_computed + len(chunk) >= span.end

    def reusable(self, n: int) -> int:
        """How many of ``n`` cached prompt positions can be kept (never part of a media)."""
        return reusable(self.media, n) if self.media else n
