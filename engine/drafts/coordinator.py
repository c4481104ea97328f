"""The engine's drafting: which sequences draft this step, and what they propose.

Built from ``model.draft_model``: prompt lookup, a draft model, or the model's own MTP
head (``engine.drafts.mtp``). Each step ``propose`` asks every generating sequence for a
proposal, sizes all of them together with ``allocate`` (each sequence's acceptance
history against the measured step times) and fills ``Request.draft``; the engine
verifies the drafts after the batched decode and reports back through
``observe_step`` and ``verified`` (and, for MTP, ``absorb`` after every decode).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from engine.config import ModelConfig
from engine.drafts.draft_model import DraftModel
from engine.drafts.mtp import MtpDrafter
from engine.drafts.mtp_runner import LlamaMtp, mtp_layers
from engine.drafts.ngram_index import Proposal
from engine.drafts.policy import (
    ALIGN,
    GROWN_MAX,
    DraftLimit,
    DraftState,
    PromptLookup,
    StepCost,
    accepted_count,
    allocate,
    default_cost,
)
from engine.loading import ModelLoadError
from engine.media.spans import is_media_token
from engine.metrics import EngineMetrics
from engine.request import Request
from engine.runner import Runner
from engine.scheduler import BatchItem

log = logging.getLogger("llamaserve.drafting")


class Drafting:
    def __init__(self, runner: Runner, cfg: ModelConfig, draft_path: str | None,
                 metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self.lookup: PromptLookup | None = None
        self.model: DraftModel | None = None
        self.mtp: MtpDrafter | None = None
        self.mtp_backend: LlamaMtp | None = None
        self.k_max = cfg.draft_max_tokens
        self.n_batch = runner.n_batch
        self.step_cost = StepCost()
        self.draft_token_seconds = 0.0  # draft model: its time per drafted token (EMA)
        self.sync_token_seconds = 0.0  # draft model: its time per token caught up on (EMA)
        # prompt lookup drafts past a small configured maximum while whole drafts are
        # accepted; not on recurrent state, which keeps only k_max snapshots to roll back
        self.grow = cfg.draft_model == "prompt-lookup-decoding" and not runner.recurrent
        if runner.recurrent:
            log.info("drafting (%s) on recurrent/hybrid memory: drafts of at most %d tokens, "
                     "rejected ones rolled back from llama.cpp's state snapshots (n_rs_seq); "
                     "a sequence is not reused as cache until its rollback is applied",
                     cfg.draft_model, self.k_max)
        if cfg.draft_model == "prompt-lookup-decoding":
            self.lookup = PromptLookup(cfg.draft_model_max_ngram_size)
        elif cfg.draft_model == "draft-model":
            if draft_path is None:
                raise ModelLoadError("draft_model 'draft-model' needs the draft GGUF's path")
            self.model = DraftModel(runner, cfg, draft_path)
        elif cfg.draft_model == "draft-mtp":
            if not mtp_layers(runner):
                raise ModelLoadError(mtp_unavailable(runner))
            self.mtp_backend = LlamaMtp(runner, cfg)
            self.mtp = MtpDrafter(self.mtp_backend, cfg.draft_model_min_p)

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
        if self.mtp_backend is not None:
            self.mtp_backend.close()

    def propose(self, running: list[Request]) -> None:
        """Set ``r.draft`` for every generating sequence that should draft this step."""
        # prompts with media do not draft: a draft model cannot read them; nor does an open
        # reasoning block with a budget (the engine may feed its end marker next)
        decoding = [r for r in running if r.prefill_done and r.output and not r.cancelled
                    and not r.media and (r.reasoning is None or r.reasoning.closed)]
        for r in running:
            r.draft = []
        if not decoding:
            return
        k_max = self.k_max
        chances = []
        for r in decoding:
            if r.draft_state is None:
                r.draft_state = DraftState(limit=DraftLimit(
                    k_max, GROWN_MAX, floor=min(k_max, ALIGN)) if self.grow else None)
            s = r.draft_state
            longest = k_max if s.limit is None else s.limit.limit
            room = max(0, min(longest, r.max_new_tokens - len(r.output) - 1))
            if self.lookup is not None:
                s.proposal = self.lookup.propose(r.prompt, r.new_output, s, room)
                n = len(s.proposal.tokens)
            else:
                s.proposal = Proposal([], "model" if self.model is not None else "mtp")
                n = room
            chances.append(s.acceptance.chances(s.proposal.kind, n))
        if self.step_cost.ready:
            cost: Callable[[int], float] = self.step_cost
            draft_cost = self.draft_token_seconds
            setup = [] if self.model is None else [
                self.sync_token_seconds * self.model.lag(
                    r.seq_id, r.num_tokens, len(r.new_output))
                for r in decoding]
        else:
            cost, draft_cost, setup = default_cost, 0.0, []
        lengths = allocate(chances, len(decoding), self.n_batch - len(decoding), cost,
                           draft_cost, setup)
        wanting = {r.seq_id: (r, k) for r, k in zip(decoding, lengths, strict=True) if k}
        if self.lookup is not None:
            for r, k in wanting.values():
                assert r.draft_state is not None and r.draft_state.proposal is not None
                r.draft = r.draft_state.proposal.tokens[:k]
        elif wanting:
            try:
                drafts = self._draft(wanting)
            except Exception:  # a failing drafter costs speed, never answers
                log.exception("drafter failed; this step goes without drafts")
                return
            for seq, draft in drafts.items():
                wanting[seq][0].draft = draft

    def _draft(self, wanting: dict[int, tuple[Request, int]]) -> dict[int, list[int]]:
        """Run the draft model or the MTP head for the sequences that draft, timing the
        drafting loop (catching up with the target is not the price of a drafted token)."""
        if self.model is not None:
            work = {seq: ([*r.prompt, *r.new_output], k) for seq, (r, k) in wanting.items()}
            started = time.perf_counter()
            fed = self.model.sync({seq: history for seq, (history, _) in work.items()})
            if fed:
                self.sync_token_seconds = _ema(self.sync_token_seconds,
                                               (time.perf_counter() - started) / fed)
            started = time.perf_counter()
            drafts = self.model.propose(work)
        else:
            assert self.mtp is not None
            started = time.perf_counter()
            drafts = self.mtp.propose({seq: (r.output[-1], r.num_computed, k)
                                       for seq, (r, k) in wanting.items()})
        drafted = max(sum(map(len, drafts.values())), 1)
        self.draft_token_seconds = _ema(self.draft_token_seconds,
                                        (time.perf_counter() - started) / drafted)
        return drafts

    def absorb(self, items: list[BatchItem]) -> None:
        """After a target decode: the MTP head takes the batch's hidden states."""
        if self.mtp is not None:
            try:
                # the token items, in the order of the target's hidden rows (media chunks
                # are decoded apart); prompts with media never draft, and the MTP head
                # cannot read media: their rows are skipped
                text = [i for i in items if not (i.tokens and is_media_token(i.tokens[0]))]
                self.mtp.absorb([(i.request.seq_id, i.tokens, i.pos) for i in text],
                                frozenset(i.request.seq_id for i in text if i.request.media))
            except Exception:
                log.exception("MTP catch-up failed")

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A decode step's size and time (decode steps only)."""
        self.step_cost.observe(tokens, seconds)

    def verified(self, r: Request, proposed: int, tokens: list[int]) -> None:
        """After a step: ``proposed`` drafted tokens (0 for a step without a draft), and
        the ``tokens`` emitted (the accepted ones, then the model's own)."""
        if proposed:
            self.metrics.drafts.inc()
            self.metrics.draft_tokens.inc(proposed)
            self.metrics.draft_accepted.inc(accepted_count(r.draft[:proposed], tokens))
        try:  # bookkeeping for later drafts: a bug here costs speed, never an answer
            if r.draft_state is not None:
                r.draft_state.verified(r.draft[:proposed], tokens)
            if self.mtp is not None:
                self.mtp.accept(r.seq_id, accepted_count(r.draft[:proposed], tokens),
                                r.num_computed)
        except Exception:
            log.exception("draft bookkeeping failed; request %d starts drafting afresh", r.id)
            r.draft_state = None


def _ema(old: float, new: float) -> float:
    """A running average of seconds per token (the first value as is)."""
    return 0.9 * old + 0.1 * new if old else new


def mtp_unavailable(runner: Runner) -> str:
    """Why ``draft-mtp`` cannot run with this model."""
    arch = runner.vocabulary.meta("general.architecture") or ""
    return (f"draft_model 'draft-mtp' needs a model with MTP (next-token prediction) "
            f"layers; this {arch or 'model'} GGUF has none "
            f"({arch}.nextn_predict_layers is missing)")
