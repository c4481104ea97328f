"""A thinking budget: when a request's reasoning block has taken its budget of tokens and
the model has not closed it, the engine closes it — it feeds the family's end-of-reasoning
marker as the next tokens, through the request's sampler (so a lazy grammar waiting for
that marker starts constraining the answer right after it).

Pure Python: the engine asks ``forced()`` before sampling and tells ``saw()`` every token
it delivers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReasoningBudget:
    """Part of a request's sampling parameters (``SamplingParams.reasoning``)."""

    tokens: int  # reasoning tokens allowed before the end is forced (0: close at once)
    end_text: str  # the family's end-of-reasoning marker, e.g. "</think>"
    end_tokens: tuple[int, ...]  # what is fed to close it: the marker and a line break


@dataclass
class ReasoningGuard:
    """One request's open reasoning block."""

    budget: ReasoningBudget
    spent: int = 0
    closed: bool = False
    _tail: str = ""
    _queue: list[int] = field(default_factory=list)

    def forced(self) -> int | None:
        """The token to feed instead of sampling, if the budget is spent (the whole closing
        sequence, once started, is fed to its end)."""
        if not self._queue and not self.closed and self.spent >= self.budget.tokens:
            self._queue = list(self.budget.end_tokens)
        return self._queue.pop(0) if self._queue else None

    def saw(self, piece: str) -> None:
        """A token was delivered (``piece``: its text, special tokens included)."""
        if self.closed:
            return
        self.spent += 1
        self._tail = (self._tail + piece)[-(len(self.budget.end_text) + 32):]
        if self.budget.end_text in self._tail:  # the model's own end, or the forced one
            self.closed = True
