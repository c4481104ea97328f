"""Draft policy (pure Python): how long each sequence's draft is, and how a draft is checked.

Each generating sequence may contribute its pending token plus a few proposed tokens
to the batched ``llama_decode``; the engine then samples every position with the
request's own sampler and keeps tokens while they equal the proposal (``verify``), so
the output is what the model would have produced token by token: greedy stays
greedy, a seeded sampler draws exactly as many times, grammars and penalties see the
same tokens. Rejected positions are removed from the KV.

``NgramIndex`` (``engine.drafts.ngram_index``) proposes for prompt lookup: a copy
cursor through text the model re-emits, re-anchored after each change, with the
changes learned as replacements for later occurrences.

``Acceptance`` learns, per sequence, how likely the first token of a proposal is to
be accepted (per kind of proposal: cursor, fresh n-gram of length n, draft model)
and how likely each following token is, given the previous one was. ``allocate``
turns those chances and the engine's measured step times (``StepCost``, a table by
batch size) into draft lengths that maximise expected tokens per second for the
whole batch, down to no drafts at all.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.drafts.ngram_index import NgramIndex, Proposal

# chance that the first token of a proposal is accepted, before any evidence
FIRST_PRIOR = {"cursor": 0.8, "anchor": 0.6, "substitute": 0.4, "ngram3": 0.6, "ngram2": 0.4,
               "ngram1": 0.25, "model": 0.7, "mtp": 0.7}
PRIOR_WEIGHT = 2.0  # in proposals' worth of evidence
RUN_PRIOR = (19.0, 1.0)  # accepted / missed follow-on tokens: 0.95 before evidence
EXPLORE = 0.5  # optimism bonus EXPLORE / (1 + tries): little evidence, try anyway
DECAY = 0.8  # per draft: recent drafts count most
IDLE_DECAY = 0.98  # per token generated without a draft: evidence fades back to the prior
ALIGN = 8  # drafted steps hold a multiple of this many tokens (see allocate)
GROWN_MAX = 64  # prompt lookup: the longest a draft grows to past a smaller configured maximum


@dataclass
class Acceptance:
    """Decayed evidence about a sequence's drafts: per proposal kind, how often the first
    token was accepted; over all, how often a token was accepted after its predecessor
    was."""

    first: dict[str, list[float]] = field(default_factory=lambda: {
        kind: [p * PRIOR_WEIGHT, PRIOR_WEIGHT] for kind, p in FIRST_PRIOR.items()})
    run: list[float] = field(default_factory=lambda: list(RUN_PRIOR))

    def chances(self, kind: str, n: int) -> list[float]:
        """Chance that drafted position i (0..n-1) is accepted."""
        hits, tries = self.first[kind]
        q = min(1.0, hits / tries + EXPLORE / (1 + tries))
        p = self.run[0] / (self.run[0] + self.run[1])
        out = []
        for _ in range(n):
            out.append(q)
            q *= p
        return out

    def observe(self, kind: str, proposed: int, accepted: int) -> None:
        f = self.first[kind]
        f[0] = DECAY * f[0] + (1 if accepted else 0)
        f[1] = DECAY * f[1] + 1
        if accepted:
            self.run[0] = DECAY * self.run[0] + accepted - 1
            self.run[1] = DECAY * self.run[1] + (1 if accepted < proposed else 0)

    def rest(self, tokens: int) -> None:
        """``tokens`` generated without drafting: let the evidence fade toward the prior,
        so a sequence whose drafts once failed tries again later."""
        d = IDLE_DECAY ** tokens
        for kind, f in self.first.items():
            f[0] = d * f[0] + (1 - d) * FIRST_PRIOR[kind] * PRIOR_WEIGHT
            f[1] = d * f[1] + (1 - d) * PRIOR_WEIGHT


@dataclass
class DraftLimit:
    """The longest draft a sequence may propose. It starts at the configured maximum
    ``base``; a draft accepted whole that used more than half the limit doubles it (up to
    ``top``, also past ``base``), since a copy that long is likely to go on; a rejected
    draft sets it to twice what the draft got right, between ``floor`` and half the
    limit: after a change the copy starts short again and grows while it holds (on this
    CPU a rejected 40-token draft costs as much as 13 plain steps). ``allocate`` still
    picks the length under it by expected tokens per second."""

    base: int
    top: int
    limit: int = 0
    floor: int = 0  # after a miss: at most this, or twice what the draft got right

    def __post_init__(self) -> None:
        self.top = max(self.top, self.base)
        self.limit = self.limit or self.base
        self.floor = self.floor or self.base

    def observe(self, proposed: int, accepted: int, emitted: int) -> None:
        """After a draft of ``proposed`` tokens, ``accepted`` of them, ``emitted`` tokens
        out (fewer than the draft when the request stopped on a drafted token)."""
        if accepted >= proposed and 2 * proposed > self.limit:  # (sized to the step's
            # alignment, a draft rarely reaches the limit itself)
            self.limit = min(self.top, 2 * self.limit)
        elif accepted < min(proposed, emitted):  # the model said something else
            self.limit = max(self.floor, min(self.limit // 2, 2 * accepted))


@dataclass
class DraftState:
    """Per-sequence drafting state, owned by the engine thread."""

    index: NgramIndex | None = None
    synced: int = 0  # tokens of prompt + output already in the index
    acceptance: Acceptance = field(default_factory=Acceptance)
    proposal: Proposal | None = None  # this step's, before sizing
    limit: DraftLimit | None = None  # adaptive longest draft (prompt lookup)

    def verified(self, draft: Sequence[int], tokens: Sequence[int]) -> None:
        """After a step that drafted ``draft`` and emitted ``tokens`` (the accepted ones
        and, unless the request stopped, the model's own next token)."""
        p = self.proposal
        proposed, accepted = len(draft), accepted_count(draft, tokens)
        if proposed and p is not None:
            self.acceptance.observe(p.kind, proposed, accepted)
            if self.limit is not None:
                self.limit.observe(proposed, accepted, len(tokens))
        else:
            self.acceptance.rest(len(tokens))
        if self.index is not None and p is not None:
            self.index.follow(p, proposed, accepted, tokens)
        self.proposal = None


@dataclass
class StepCost:
    """Seconds per decode step by the number of tokens in it, from the engine's own
    timings: an average per observed size (``alpha``-weighted, so it follows the
    context growing), interpolated between observed sizes and extrapolated with a
    least-squares line. Batched kernels are not linear in the size (a single token
    takes a matrix-vector path; tile multiples are cheaper), hence the table."""

    alpha: float = 0.2
    table: dict[int, float] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # sorted sizes seen at least twice
    fit_decay: float = 0.98
    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        old = self.table.get(tokens)
        self.table[tokens] = seconds if old is None else old + self.alpha * (seconds - old)
        self.seen[tokens] = self.seen.get(tokens, 0) + 1
        if self.seen[tokens] == 2:
            bisect.insort(self.sizes, tokens)
        d = self.fit_decay
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
        if fixed < 0:  # a line through the origin instead
            fixed, per_token = 0.0, self.sxy / self.sxx
        if per_token <= 0:
            return None
        return fixed, per_token

    @property
    def ready(self) -> bool:
        return self.fit() is not None

    def __call__(self, n: int) -> float:
        """Estimated seconds for a step of ``n`` tokens (once ``ready``)."""
        sizes = self.sizes
        if n in self.table and self.seen[n] >= 2:
            return self.table[n]
        i = bisect.bisect_left(sizes, n)
        if 0 < i < len(sizes):
            a, b = sizes[i - 1], sizes[i]
            ta, tb = self.table[a], self.table[b]
            return ta + (tb - ta) * (n - a) / (b - a)
        fixed, per_token = self.fit() or (0.0, 1.0)
        if not sizes:
            return fixed + per_token * n
        if i == 0:  # below the smallest size: its cost per token (optimistic, so a
            # plain step gets tried and measured when drafting has crowded it out; the
            # line would put one token at 2.3 times its cost here, drafts always winning)
            return self.table[sizes[0]] * n / sizes[0]
        return self.table[sizes[-1]] + self._top_slope(per_token) * (n - sizes[-1])

    def _top_slope(self, fitted: float) -> float:
        """Seconds per token past the largest size seen: the slope between it and the
        largest size at most half as big (the fitted line leans on the many one-token
        steps, whose matrix-vector path makes a second token look far dearer than the
        32nd; too dear a guess and larger drafts are never tried, so never measured)."""
        sizes = self.sizes
        top = sizes[-1]
        below = [s for s in sizes if 2 * s <= top] or sizes[:1]
        if below[-1] == top:
            return fitted
        local = (self.table[top] - self.table[below[-1]]) / (top - below[-1])
        return local if local > 0 else fitted


def default_cost(n: int) -> float:
    """Relative step cost before anything was measured: an extra token costs 0.35 of a
    single-token step."""
    return 1.0 + 0.35 * (n - 1)


def allocate(chances: Sequence[Sequence[float]], base: int, limit: int,
             cost: Callable[[int], float], draft_cost: float = 0.0,
             setup: Sequence[float] = ()) -> list[int]:
    """Draft lengths for sequences whose i-th drafted token is accepted with chance
    ``chances[s][i]`` (decreasing in i), in a step of ``base`` tokens without drafts.
    The D most likely drafted tokens over all sequences are the best D to add; pick
    the D (up to ``limit``) maximising expected tokens emitted per second,
    ``(base + Σ chances) / (cost(base + D) + draft_cost·D + Σ setup)``, where
    ``setup[s]`` is paid once if sequence s drafts at all (a draft model catching up on
    what it did not see while the sequence was not drafting). Steps of more than
    ``ALIGN`` tokens are kept to multiples of it: matrix kernels work in tiles, and a
    ragged last tile costs nearly a whole one (measured on CPU: 16 tokens 172 ms, 17
    tokens 210 ms)."""
    plain = cost(base)
    per_token = plain / max(base, 1)  # the time a token takes without drafts
    # a sequence whose catch-up costs more than all its drafts could save sits out
    drafting = [s for s, cs in enumerate(chances)
                if not setup or setup[s] < sum(cs) * per_token]
    ranked = sorted(((c, -(setup[s] if setup else 0.0), s) for s in drafting
                     for c in chances[s]), reverse=True)
    best, best_d, expected = base / plain, 0, float(base)
    paid: set[int] = set()
    fixed = 0.0
    for d, (c, _, s) in enumerate(ranked[:max(limit, 0)], 1):
        expected += c
        if setup and s not in paid:
            paid.add(s)
            fixed += setup[s]
        n = base + d
        if n > ALIGN and n % ALIGN:
            continue
        rate = expected / (cost(n) + draft_cost * d + fixed)
        if rate > best:
            best, best_d = rate, d
    lengths = [0] * len(chances)
    for _, _, s in ranked[:best_d]:
        lengths[s] += 1
    return lengths


def accepted_count(draft: Sequence[int], tokens: Sequence[int]) -> int:
    """How many drafted tokens were accepted, given the tokens a step emitted."""
    n = 0
    while n < len(draft) and n < len(tokens) and draft[n] == tokens[n]:
        n += 1
    return n


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
                k: int) -> Proposal:
        """Only tokens not yet indexed are looked at: O(max_ngram) per new token."""
        if s.index is None:
            s.index = NgramIndex(self.max_ngram)
        if s.synced < len(prompt):
            s.index.extend(prompt[s.synced:])
            s.synced = len(prompt)
        s.index.extend(output[s.synced - len(prompt):])
        s.synced = len(prompt) + len(output)
        return s.index.propose(k)
