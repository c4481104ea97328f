"""Counts the KV cells in use when sequences share cells (pure Python).

In a unified KV cache ``llama_memory_seq_cp`` does not copy data: the copied
cells simply belong to both sequences. So "cells in use" is not the sum of the
sequences' lengths. The ledger models each run of cells written by decoding as
a segment; a sequence holds a prefix of each of its segments (copies and tail
removals only ever keep prefixes), and a segment occupies as many cells as its
longest holder uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass
class _Holding:
    runs: list[list[int]] = field(default_factory=list)  # [segment id, length] in order
    growable: int | None = None  # the segment this sequence created and may extend


class KvLedger:
    def __init__(self) -> None:
        self._held: dict[int, _Holding] = {}
        self._ids = itertools.count()
        self.appended = 0  # cells ever appended: ``cells`` grows by at most this much...
        self.changes = 0  # ...while no truncate, copy or clear has happened

    def _holding(self, seq: int) -> _Holding:
        return self._held.setdefault(seq, _Holding())

    def length(self, seq: int) -> int:
        return sum(n for _, n in self._holding(seq).runs)

    def append(self, seq: int, n: int) -> None:
        self.appended += n
        h = self._holding(seq)
        if h.growable is not None and h.runs and h.runs[-1][0] == h.growable:
            h.runs[-1][1] += n
        else:
            h.growable = next(self._ids)
            h.runs.append([h.growable, n])

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first ``n`` cells of ``seq``."""
        self.changes += 1
        h = self._holding(seq)
        kept: list[list[int]] = []
        left = n
        for seg, length in h.runs:
            if left <= 0:
                break
            kept.append([seg, min(length, left)])
            left -= length
        h.runs = kept
        h.growable = None  # the cells past the cut may still belong to another sequence

    def copy(self, src: int, dst: int, n: int) -> None:
        """``dst`` now shares the first ``n`` cells of ``src``."""
        runs = [list(r) for r in self._holding(src).runs]
        self._held[dst] = _Holding(runs)
        self.truncate(dst, n)

    def clear(self, seq: int) -> None:
        self.changes += 1
        self._held[seq] = _Holding()

    def cells(self, seqs: Collection[int] | None = None) -> int:
        """Distinct cells held by ``seqs`` (all sequences when None)."""
        widest: dict[int, int] = {}
        for seq, h in self._held.items():
            if seqs is not None and seq not in seqs:
                continue
            for seg, length in h.runs:
                if length > widest.get(seg, 0):
                    widest[seg] = length
        return sum(widest.values())
