"""Draft (speculative) decoding: proposals, adaptive length, and verification (pure Python).

Each generating sequence may contribute its pending token plus a few proposed tokens
to the batched ``llama_decode``; the engine then samples every position with the
request's own sampler and keeps tokens while they equal the proposal (``verify``), so
the output is what the model would have produced token by token: greedy stays
greedy, a seeded sampler draws exactly as many times, grammars and penalties see the
same tokens. Rejected positions are removed from the KV.

``PromptLookup`` proposes the continuation of the most recent earlier occurrence of
the trailing n-gram (longest first) in prompt + output, through an index updated in
O(max_ngram) per token. ``DraftControl`` sizes each sequence's draft from its own
acceptance history and the engine's measured cost of a token in the batch, down to
0, so drafting does not make a workload slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """Most recent end position of every n-gram (n = 1..max_n) in a token history."""

    max_n: int
    history: list[int] = field(default_factory=list)
    last_end: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    previous: list[int] = field(default_factory=list)  # earlier end of the trailing n-gram

    def __post_init__(self) -> None:
        self.last_end = [{} for _ in range(self.max_n + 1)]
        self.previous = [-1] * (self.max_n + 1)

    def extend(self, tokens: Sequence[int]) -> None:
        h = self.history
        for token in tokens:
            h.append(token)
            end = len(h)
            for n in range(1, min(self.max_n, end) + 1):
                key = tuple(h[end - n:end])
                self.previous[n] = self.last_end[n].get(key, -1)
                self.last_end[n][key] = end

    def propose(self, k: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest trailing
        n-gram seen before."""
        for n in range(min(self.max_n, len(self.history)), 0, -1):
            start = self.previous[n]
            if start >= 0:
                return self.history[start:start + k]
        return []


@dataclass
class DraftState:
    """Per-sequence drafting state, owned by the engine thread."""

    index: NgramIndex | None = None
    synced: int = 0  # tokens of prompt + output already in the index
    accepted: float = 2.0  # decayed counts of accepted / rejected draft tokens (a prior of
    rejected: float = 1.0  # about 2 in 3 accepted before any evidence)
    idle: int = 0  # tokens generated since this sequence last drafted
    explore_after: int = 16  # a sequence priced out of drafting still tries 1 token this often

    @property
    def p_accept(self) -> float:
        """Estimated chance that the next drafted token is accepted."""
        return (self.accepted + 1) / (self.accepted + self.rejected + 2)


@dataclass
class StepCost:
    """Least-squares fit of ``step seconds = fixed + per_token * tokens`` over recent
    steps (exponentially weighted), from the engine's own timings."""

    decay: float = 0.98
    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self.w = d * self.w + 1
        self.sx = d * self.sx + tokens
        self.sy = d * self.sy + seconds
        self.sxx = d * self.sxx + tokens * tokens
        self.sxy = d * self.sxy + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        var = self.w * self.sxx - self.sx * self.sx
        if self.w < 4 or var <= 1e-9 * max(self.w * self.sxx, 1):
            return None
        per_token = (self.w * self.sxy - self.sx * self.sy) / var
        fixed = (self.sy - per_token * self.sx) / self.w
        if per_token <= 0 or fixed < 0:
            return None
        return fixed, per_token


@dataclass
class DraftControl:
    """How many tokens to draft for a sequence this step: as long as the next drafted
    token is still worth its price. An extra token in the batch costs ``per_token``;
    an accepted one saves what a token costs without drafting, ``(fixed + per_token * B)
    / B`` with B generating sequences; the i-th drafted token is accepted with
    probability p**i. So draft while p**i exceeds the ratio of the two costs: on a
    memory-bound single stream that ratio is small and drafts run long, in a busy batch
    it nears 1 and only sequences whose drafts nearly always hit keep drafting."""

    k_max: int
    default_ratio: float = 0.35  # before the engine has timed enough steps

    def ratio(self, cost: StepCost, n_decoding: int, draft_cost: float = 0.0) -> float:
        """Price of one more drafted token (verification, plus ``draft_cost`` seconds
        spent proposing it) over the price of a token without drafting."""
        fit = cost.fit()
        if fit is None:
            return self.default_ratio
        fixed, per_token = fit
        b = max(n_decoding, 1)
        return min(1.0, (per_token + draft_cost) * b / (fixed + per_token * b))

    def length(self, s: DraftState, ratio: float) -> int:
        p = s.p_accept
        k = 0 if p <= ratio else min(self.k_max, int(math.log(ratio) / math.log(p)))
        if k == 0 and s.idle >= s.explore_after:
            return 1  # a one-token probe, so an estimate that fell can recover
        return k

    def update(self, s: DraftState, proposed: int, accepted: int, emitted: int = 1) -> None:
        if proposed == 0:
            s.idle += emitted
            return
        s.idle = 0
        s.accepted = 0.9 * s.accepted + accepted
        s.rejected = 0.9 * s.rejected + (1 if accepted < proposed else 0)
        if proposed == 1:  # a probe: back off further when it misses
            s.explore_after = 16 if accepted else min(2 * s.explore_after, 1024)


def verify(draft: Sequence[int], sample: Callable[[int], int],
           stop_after: Callable[[int, int], bool]) -> list[int]:
    """Sample position j = 0..len(draft) with the target's sampler and go on while the
    sampled token equals ``draft[j]``; ``stop_after(j, token)`` ends early (end of
    generation, length). Returns the tokens to emit: all but the last are accepted draft
    tokens (they stay in the KV), the last is the model's own next token."""
    out: list[int] = []
    for j in range(len(draft) + 1):
        token = sample(j)
        out.append(token)
        if stop_after(j, token) or j == len(draft) or token != draft[j]:
            break
    return out


class PromptLookup:
    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram

    def propose(self, prompt: Sequence[int], output: Sequence[int], s: DraftState,
                k: int) -> list[int]:
        """Only tokens not yet indexed are looked at: O(max_ngram) per new token."""
        if s.index is None:
            s.index = NgramIndex(self.max_ngram)
        if s.synced < len(prompt):
            s.index.extend(prompt[s.synced:])
            s.synced = len(prompt)
        s.index.extend(output[s.synced - len(prompt):])
        s.synced = len(prompt) + len(output)
        return s.index.propose(k)
