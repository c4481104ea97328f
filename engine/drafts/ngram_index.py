"""Prompt lookup's proposals (pure Python): an n-gram index over prompt + output, a copy
cursor that follows the model through text it re-emits with edits, and replacements
learned from those edits.

While the model re-emits earlier text (a file it was shown), the next proposal continues
from where the last accepted one left off. At a change the draft is rejected at the
changed token; the cursor then re-anchors on the nearest occurrence of the trailing
n-gram (or, with none yet, assumes one token was replaced and skips it). Once a proposal
from the re-anchored cursor is accepted, the change — source tokens between the miss and
the anchor → what the model said there, common ends stripped — is a *replacement*: later
proposals apply it wherever the source holds its tokens (a rename of a multi-token
identifier, a removed argument), so a scattered rename costs one rejected draft, not one
per occurrence. A replacement the model contradicts (it keeps the original) is dropped.
Otherwise: what followed the most recent earlier occurrence of the longest trailing
n-gram.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

CURSOR_BEHIND, CURSOR_AHEAD = 4, 32  # resynchronisation window around the copy cursor
CURSOR_STRIKES = 2  # drafts missed at their first token before the cursor is dropped
LONGEST_REPLACEMENT = 8  # tokens on either side of a learned replacement
MAX_REPLACEMENTS = 32  # the most recent ones are kept
COPYING = ("cursor", "anchor", "substitute")  # proposals that follow the copy cursor

Tokens = tuple[int, ...]


@dataclass
class Proposal:
    tokens: list[int]
    kind: str  # a FIRST_PRIOR key of engine.drafts.policy
    src: int = -1  # prompt lookup: history position tokens[0] was copied from
    ends: list[int] = field(default_factory=list)  # source position after each token (-1:
    # inside a replacement)
    at: int = -1  # history length when proposed (output position of tokens[0])
    swaps: list[tuple[int, Tokens, Tokens]] = field(default_factory=list)  # replacements
    # applied: (index in tokens, source pattern, what was proposed instead)


@dataclass
class Replacements:
    """Learned source pattern → replacement, matched by the pattern's first token."""

    table: dict[Tokens, Tokens] = field(default_factory=dict)
    by_first: dict[int, list[Tokens]] = field(default_factory=dict)  # longest first

    def add(self, pattern: Tokens, said: Tokens) -> None:
        self.table.pop(pattern, None)
        self.table[pattern] = said
        while len(self.table) > MAX_REPLACEMENTS:
            del self.table[next(iter(self.table))]
        self._index()

    def drop(self, pattern: Tokens) -> None:
        if self.table.pop(pattern, None) is not None:
            self._index()

    def _index(self) -> None:
        self.by_first = {}
        for pattern in sorted(self.table, key=len, reverse=True):
            self.by_first.setdefault(pattern[0], []).append(pattern)

    def at(self, history: Sequence[int], i: int) -> Tokens | None:
        """The longest learned pattern starting at history position ``i``."""
        for pattern in self.by_first.get(history[i], ()):
            if tuple(history[i:i + len(pattern)]) == pattern:
                return pattern
        return None

    def __bool__(self) -> bool:
        return bool(self.table)


def replacement(source: Sequence[int], said: Sequence[int]) -> tuple[Tokens, Tokens] | None:
    """``source`` → ``said`` with their common prefix and suffix stripped; None when
    nothing is left of the source (an insertion has nothing to match on), or too long."""
    a, b = list(source), list(said)
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    if not a or len(a) > LONGEST_REPLACEMENT or len(b) > LONGEST_REPLACEMENT:
        return None
    return tuple(a), tuple(b)


@dataclass
class NgramIndex:
    """Every end position of every n-gram (n = 1..max_n) in a token history, the copy
    cursor and the learned replacements."""

    max_n: int
    history: list[int] = field(default_factory=list)
    ends: list[dict[int, list[int]]] = field(default_factory=list)  # n-gram hash -> ends
    cursor: int = -1  # history position expected to be copied next
    aligned: bool = False  # the cursor is in step with the end of the history
    strikes: int = 0
    missed: bool = False  # the last draft was rejected part-way
    miss: tuple[int, int] | None = None  # (source, output) positions where the model left
    # the copy, until a proposal from a re-anchored cursor confirms what it said instead
    replacements: Replacements = field(default_factory=Replacements)

    def __post_init__(self) -> None:
        self.ends = [{} for _ in range(self.max_n + 1)]

    def extend(self, tokens: Sequence[int]) -> None:
        h = self.history
        for token in tokens:
            h.append(token)
            end = len(h)
            for n in range(1, min(self.max_n, end) + 1):
                self.ends[n].setdefault(hash(tuple(h[end - n:end])), []).append(end)

    def _near_cursor(self, ends: list[int], end: int) -> int:
        """The occurrence closest to the cursor inside its window, or -1."""
        lo, hi = self.cursor - CURSOR_BEHIND, min(self.cursor + CURSOR_AHEAD, end - 1)
        i = bisect.bisect_left(ends, self.cursor)
        best = -1
        for j in (i - 1, i):
            if 0 <= j < len(ends) and lo <= ends[j] <= hi and (
                    best < 0 or abs(ends[j] - self.cursor) < abs(best - self.cursor)):
                best = ends[j]
        return best

    def _resumed(self, ends: list[int], n: int, end: int) -> int:
        """After a change: the first occurrence that starts at or after where the model
        left the source (it comes back there after an insertion, a little later after
        a replacement), or -1."""
        if self.miss is None:
            return -1
        src = self.miss[0]
        i = bisect.bisect_left(ends, src)  # (the n-gram may end right before that point)
        if i < len(ends) and ends[i] <= min(src + n + CURSOR_AHEAD, end - 1):
            return ends[i]
        return -1

    def _copy(self, start: int, k: int, kind: str) -> Proposal:
        """``k`` tokens from ``start`` with the learned replacements applied."""
        h, subs = self.history, self.replacements
        p = Proposal([], kind, start, at=len(h))
        i, end = start, len(h)
        while len(p.tokens) < k and i < end:
            pattern = subs.at(h, i) if subs else None
            if pattern is None:
                p.tokens.append(h[i])
                i += 1
                p.ends.append(i)
                continue
            said = subs.table[pattern]
            p.swaps.append((len(p.tokens), pattern, said))
            i += len(pattern)
            p.tokens.extend(said)
            p.ends.extend([-1] * (len(said) - 1) + [i] if said else [])
            if not said and p.ends:  # a deletion: the token before now ends past it
                p.ends[-1] = i
        del p.tokens[k:], p.ends[k:]
        return p

    def propose(self, k: int) -> Proposal:
        h = self.history
        end = len(h)
        longest = min(self.max_n, end)
        cur = self.cursor
        if self.aligned and 0 <= cur < end:
            return self._copy(cur, k, "substitute" if self.missed else "cursor")
        # where each trailing n-gram (longest first) occurred
        occurrences = [(n, self.ends[n].get(hash(tuple(h[end - n:end])), []))
                       for n in range(longest, 0, -1)]
        if self.miss is not None:
            for n, ends in occurrences:
                start = self._resumed(ends, n, end)
                if start >= 0:
                    return self._copy(start, k, "anchor")
        if 0 < cur < end:
            for _, ends in occurrences:
                start = self._near_cursor(ends, end)
                if start >= 0:
                    return self._copy(start, k, "anchor")
            if self.missed:  # the model replaced a token: skip it
                return self._copy(cur, k, "substitute")
        for n, ends in occurrences:
            if len(ends) >= 2:  # the last one is the trailing n-gram itself
                return self._copy(ends[-2], k, f"ngram{min(n, 3)}")
        return Proposal([], "ngram1", at=end)

    def follow(self, p: Proposal, proposed: int, accepted: int, tokens: Sequence[int]) -> None:
        """Move the cursor after a step that drafted ``proposed`` tokens of ``p`` and
        emitted ``tokens`` (the accepted ones, then the model's own); learn and forget
        replacements."""
        # a miss: the model said something else (not: the request stopped on a drafted token)
        self.missed = proposed > 0 and accepted < min(proposed, len(tokens))
        if p.src < 0 or not p.tokens or not tokens:
            self.aligned = False
            if self.cursor >= 0:
                self.cursor += len(tokens)
            return
        n, h = len(tokens), self.history
        j = 0  # tokens of the proposal the model followed
        while j < min(n, len(p.tokens)) and tokens[j] == p.tokens[j]:
            j += 1
        if j >= 2 and self.miss is not None and p.kind in COPYING and (
                p.src >= self.miss[0] and p.at >= self.miss[1]):
            # back in step after a change: what the model said there is a replacement
            found = replacement(h[self.miss[0]:p.src], h[self.miss[1]:p.at])
            if found is not None:
                self.replacements.add(*found)
            self.miss = None
        if j < 2 and self.miss is not None and p.kind not in COPYING:
            # mid-edit, a token or two that a fresh n-gram guessed do not move the copy
            self.aligned = False
            return
        self.aligned = False
        if j == n or j == len(p.tokens) == n - 1:  # followed (the last one maybe beyond)
            end = p.ends[j - 1] if j else p.src
            if end < 0:  # stopped inside a replacement (the request ended)
                return
            peek = self._copy(end, 1, p.kind) if j < n else p
            if j == n or (peek.tokens == [tokens[-1]] and peek.ends[0] >= 0):
                self.cursor, self.aligned, self.strikes = peek.ends[0] if j < n else end, True, 0
                return
            self.missed = True  # one token past the proposal, the model left the copy
        if j == 0 and p.kind not in COPYING:  # a fresh n-gram guess failed: the copy
            return  # cursor stays where it was (the model may be inserting new text)
        for i, pattern, said in p.swaps:  # a replacement the model did not follow
            if i <= j < i + max(len(said), 1):
                self.replacements.drop(pattern)
        source = p.src if j == 0 else p.ends[j - 1]
        if source < 0:  # inside a replacement: back to where it started
            source = next(pos for pos in reversed([p.src, *p.ends[:j]]) if pos >= 0)
        if self.miss is None or j >= 2:  # (one token, indentation say, matches anywhere)
            self.miss = (source, p.at + j)
        if j > 0 or (p.kind in COPYING and self.strikes < CURSOR_STRIKES):
            # assume the model's token replaced the one the draft had there
            self.strikes = 0 if j > 0 else self.strikes + 1
            self.cursor = source + 1 + (n - 1 - j)
        else:
            self.cursor, self.miss = -1, None
