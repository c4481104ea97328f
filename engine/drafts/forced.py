"""Tokens a grammar forces, decoded as a draft that needs no checking (engine thread).

Where a grammar allows one continuation only (the rest of a JSON key after its opening
quote, of an enum value, of a tool call's fixed markup), llguidance names its tokens
(``compute_ff_tokens``, ``engine.sampling.grammar_step``). They go into the request's next
decode item after the token before them, as a draft does, but are taken without sampling:
llama.cpp's grammar confirms each (``Engine._verify``), and the step samples only the
position after them. A forced token costs a decode position and no sampling step; its text
is what sampling would have given (the only continuation), in its canonical tokens.

Only without a draft engine: drafts and forced tokens share ``Request.draft``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.request import Request, Status
from engine.runner import Runner

MAX_FORCED = 16  # forced tokens decoded in one step, per sequence


def propose_forced(running: Iterable[Request], runner: Runner) -> None:
    """Set ``r.draft`` to the tokens each constrained, generating sequence's grammar forces
    next (``r.forced``: how many); clear last step's."""
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


@dataclass
class DraftSampler:
    """What ``verify`` samples at a draft's position ``j``: a forced token, taken as if
    sampled once llama.cpp's grammar agrees; otherwise the request's sampler on that
    position's logits."""

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
