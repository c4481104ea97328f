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
    # "": the prompt opened the block. Else the family's opener ("<think>", "[THINK]"): the
    # model may open it itself at the start of its answer, and the budget counts from
    # there; an answer that starts otherwise has no reasoning block to close
    start_text: str = ""


@dataclass
class ReasoningGuard:
    """One request's reasoning block: open from the start, or (``budget.start_text``) once
    the answer opens it."""

    budget: ReasoningBudget
    spent: int = 0
    closed: bool = False
    _tail: str = ""
    _queue: list[int] = field(default_factory=list)
    _head: str | None = None  # the answer so far while it may still be opening the block

    def __post_init__(self) -> None:
        if self.budget.start_text:
            self._head = ""

    @property
    def opened(self) -> bool:
        return self._head is None

    def forced(self) -> int | None:
        """The token to feed instead of sampling, if the budget is spent (the whole closing
        sequence, once started, is fed to its end)."""
        if not self._queue and not self.closed and self.opened and \
                self.spent >= self.budget.tokens:
            self._queue = list(self.budget.end_tokens)
        return self._queue.pop(0) if self._queue else None

    def saw(self, piece: str) -> None:
        """A token was delivered (``piece``: its text, special tokens included)."""
        if self.closed:
            return
        if self._head is not None:  # not open yet: is the answer opening it?
            self._head += piece
            head, start = self._head.lstrip(), self.budget.start_text
            if head.startswith(start):
                self._head = None  # open: what follows the opener counts
                piece = head[len(start):]
                if not piece:
                    return
            elif not start.startswith(head):
                self.closed = True  # the answer does not reason: nothing to close
                return
            else:
                return
        self.spent += 1
        self._tail = (self._tail + piece)[-(len(self.budget.end_text) + 32):]
        if self.budget.end_text in self._tail:  # the model's own end, or the forced one
            self.closed = True
