"""Tokens a grammar forces, decoded as a draft that needs no checking (engine thread).

Where a grammar allows one continuation only (the rest of a JSON key after its opening
quote, of an enum value, of a tool call's fixed markup), llguidance names its tokens
(``compute_ff_tokens``, ``engine.sampling.grammar_step``). They go into the request's next
decode item after the token before them, as a draft does, but are taken without sampling
and without their logits: llama.cpp's grammar confirms each (``take_forced``), and the step
reads and samples only the position after them. A forced token costs a decode position,
no output row and no sampling step; its text is what sampling would have given (the only
continuation), in its canonical tokens. With logprobs asked for, every position has its
logits and a forced token its logprob (``DraftSampler``).

Only without a draft engine (drafts and forced tokens share ``Request.draft``), and not on
recurrent or hybrid memory: a token llama.cpp's grammar refused would have to be cut from
a state that keeps no snapshots without drafting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.caches.prefix_cache import PrefixCache
from engine.delivery import Delivery, Out
from engine.request import Request, Status
from engine.runner import Runner
from engine.scheduler import BatchItem

MAX_FORCED = 16  # forced tokens decoded in one step, per sequence


def propose_forced(running: Iterable[Request], runner: Runner) -> None:
    """Set ``r.draft`` to the tokens each constrained, generating sequence's grammar forces
    next (``r.forced``: how many); clear last step's."""
    if runner.recurrent:
        return
    for r in running:
        if r.forced:
            r.draft, r.forced = [], 0
        if not r.params.grammar or r.sampler is None or not r.output or r.cancelled \
                or r.status is not Status.RUNNING or r.num_computed < len(r.prompt):
            continue
        if r.reasoning is not None and not r.reasoning.closed:
            continue  # a thinking budget may put its end marker next
        room = r.max_new_tokens - len(r.output) - 1
        if room > 0:
            tokens = runner.forced(r.sampler, min(MAX_FORCED, room))
            if tokens:
                r.draft, r.forced = tokens, len(tokens)


def take_forced(item: BatchItem, last_index: int, runner: Runner, delivery: Delivery,
                cache: PrefixCache, out: Out) -> bool:
    """Take a step's forced tokens, decoded without logits but after the last
    (``Request.forced_unsampled``): True when all were taken and the request goes on, so
    the caller samples the position after them. Where llama.cpp's grammar refuses one (the
    engines disagree), what came before it stays and the last token taken is decoded again
    next step, for the logits that follow it."""
    r, draft = item.request, item.tokens[1:]
    taken = 0
    for token in draft[:r.forced]:
        if not runner.take_forced(r.sampler, token):
            break
        taken += 1
        if not delivery.emit(r, token, last_index, out):
            break  # finished (a stop string, max_tokens): its sequence is released
    if taken:
        delivery.metrics.forced_tokens.inc(taken)
    if r.status is not Status.RUNNING:
        return False
    if taken < len(draft):
        r.num_computed = item.pos + taken
        cache.trim(r, r.num_computed)
        return False
    return True


@dataclass
class DraftSampler:
    """What ``verify`` samples at a draft's position ``j`` when every position has logits
    (logprobs asked for): a forced token, taken as if sampled once llama.cpp's grammar
    agrees; otherwise the request's sampler on that position's logits."""

    runner: Runner
    request: Request
    draft: list[int]
    first: int  # the batch index of the logits that predict draft[0]
    taken: int = 0  # forced tokens taken

    def __call__(self, j: int) -> int:
        r = self.request
        if j < min(r.forced, len(self.draft)) and \
                self.runner.take_forced(r.sampler, self.draft[j]):
            self.taken += 1
            return self.draft[j]
        return self.runner.sample(r.sampler, self.first + j)
