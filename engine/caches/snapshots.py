"""Recurrent-state snapshots held in RAM (pure Python, no llama.cpp).

A recurrent or hybrid sequence's KV keeps one recurrent state, at its last position;
its attention KV keeps every position. A *snapshot* is the recurrent part alone
(``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) taken
right after the sequence's prefill reached position ``pos``: restoring it and cutting
the attention KV at ``pos`` gives the sequence exactly as it was then, so a prompt
sharing the first ``pos`` tokens continues from there (``engine.caches.prefix_cache``).

A snapshot is valid for a sequence while that sequence still holds its first ``pos``
tokens; a copy of those positions to another sequence takes the sequence's snapshots
along (shared, counted once). The store is bounded in bytes, least recently used
snapshots go first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.metrics import EngineMetrics


@dataclass(eq=False)
class Snapshot:
    pos: int  # the state has read positions [0, pos)
    data: bytes
    last_used: int = 0
    holders: set[int] = field(default_factory=set)  # sequence ids it is valid for


class SnapshotStore:
    def __init__(self, max_bytes: int, metrics: EngineMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.by_seq: dict[int, dict[int, Snapshot]] = {}
        self.bytes = 0
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len({id(s) for snaps in self.by_seq.values() for s in snaps.values()})

    def positions(self, seq: int) -> list[int]:
        return sorted(self.by_seq.get(seq, {}))

    def get(self, seq: int, pos: int) -> Snapshot | None:
        return self.by_seq.get(seq, {}).get(pos)

    def best(self, seq: int, limit: int) -> Snapshot | None:
        """The snapshot of ``seq`` furthest along at or before ``limit``."""
        snaps = self.by_seq.get(seq)
        if not snaps:
            return None
        pos = max((p for p in snaps if 0 < p <= limit), default=0)
        return snaps[pos] if pos else None

    def add(self, seq: int, pos: int, data: bytes) -> Snapshot | None:
        if not data or len(data) > self.max_bytes:
            return None
        self.drop(seq, pos)
        snap = Snapshot(pos, bytes(data), next(self._clock), {seq})
        self.by_seq.setdefault(seq, {})[pos] = snap
        self.bytes += len(snap.data)
        self._fit(keep=snap)
        self._gauges()
        return snap

    def touch(self, snap: Snapshot) -> None:
        snap.last_used = next(self._clock)

    def share(self, src: int, dst: int, upto: int) -> None:
        """``dst`` now holds ``src``'s first ``upto`` positions: its snapshots there hold."""
        for pos, snap in self.by_seq.get(src, {}).items():
            if pos <= upto:
                self._unhold(dst, pos)
                snap.holders.add(dst)
                self.by_seq.setdefault(dst, {})[pos] = snap

    def truncate(self, seq: int, keep: int) -> None:
        """``seq`` keeps only its first ``keep`` positions."""
        for pos in [p for p in self.by_seq.get(seq, {}) if p > keep]:
            self.drop(seq, pos)
        self._gauges()

    def clear(self, seq: int) -> None:
        self.truncate(seq, -1)

    def drop(self, seq: int, pos: int) -> None:
        self._unhold(seq, pos)
        self._gauges()

    def _unhold(self, seq: int, pos: int) -> None:
        snaps = self.by_seq.get(seq)
        snap = snaps.pop(pos, None) if snaps else None
        if snap is None:
            return
        snap.holders.discard(seq)
        if not snap.holders:
            self.bytes -= len(snap.data)
        if not snaps:
            del self.by_seq[seq]

    def _fit(self, keep: Snapshot) -> None:
        while self.bytes > self.max_bytes:
            unique = {id(s): s for snaps in self.by_seq.values() for s in snaps.values()
                      if s is not keep}
            if not unique:
                return
            oldest = min(unique.values(), key=lambda s: s.last_used)
            for seq in list(oldest.holders):
                self._unhold(seq, oldest.pos)
            if self.metrics is not None:
                self.metrics.snapshots_evicted.inc()

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.snapshot_bytes.set(self.bytes)
