"""The prefix cache's snapshot paths (pure Python): where a request's prefill snapshots its
sequence, taking the snapshots, and resuming a sequence from one. ``PrefixCache``
(``engine.caches.prefix_cache``) mixes them in and decides when they are used; the bytes
live in ``engine.caches.snapshots``.

Two kinds of memory cannot be cut back to any prefix, and both are served by snapshots
(``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``, the part of a
sequence's memory that is not a full attention KV — what llama-server's context checkpoints
hold):

- recurrent or hybrid memory (Mamba, RWKV, Qwen3.5's Gated DeltaNet) keeps one recurrent
  state per sequence, at its last position: the snapshot is that state;
- sliding-window attention with ``swa_full: false`` (Gemma 3, gpt-oss; llama.cpp's iSWA
  cache) keeps only the last window (``n_swa`` positions) of its window layers: the
  snapshot is that window. The full-attention layers keep every position, so a sequence
  that went further than a window past ``p`` continues at ``p`` only from a snapshot.

Resuming at ``p``: the full KV is kept in place or copied (``seq_cp``) below ``p``, the
snapshot replaces the partial part, and the positions from ``p`` on are cut
(``Runner.seq_rewind``). The restored memory is checked before anything is decoded on it,
as llama.cpp itself checks before reusing a sequence: its last position must be ``p - 1``
(a state that read other tokens is not), and a window must reach back to ``p - n_swa``
(``seq_pos_min``; its positions are consecutive, as llama.cpp's decode requires, because
llama.cpp writes the window it saved cell by cell). A snapshot failing either is dropped
with a log line and the prompt is evaluated: never an answer from the wrong state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.caches.kv_ledger import KvLedger
from engine.caches.snapshots import Snapshot, SnapshotStore
from engine.request import Request

if TYPE_CHECKING:
    from engine.caches.disk_cache import DiskCache
    from engine.caches.prefix_cache import KvOps, Slot
    from engine.caches.prefix_tree import PrefixTree
    from engine.metrics import EngineMetrics

log = logging.getLogger("llamaserve.prefix_cache")

# Cached sequences shorter than this are reclaimed before an empty sequence id is used: they
# are cheap to recompute, and every cell in use widens attention for all sequences.
SHORT_CACHE = 256
# Snapshots per prompt at message ends (besides the divergence point and the prompt's end):
# the first message's (the system prompt) and the last few.
SNAPSHOT_LAST_MESSAGES = 3
SNAPSHOT_MIN_GAP = 16  # a snapshot this close before a later one is not worth its bytes


class SnapshotPaths:
    """Mixed into ``PrefixCache``: the attributes and methods below are its own."""

    slots: list[Slot]
    kv: KvOps
    snaps: SnapshotStore
    ledger: KvLedger
    metrics: EngineMetrics | None
    disk: DiskCache | None
    is_eog: Callable[[int], bool]
    unified: bool
    recurrent: bool
    n_swa: int
    snapshots_on: bool

    if TYPE_CHECKING:
        def _tree(self, adapters: tuple[tuple[str, float], ...]) -> PrefixTree[int]: ...
        def _victim(self, keep: tuple[Slot, ...] = ()) -> Slot: ...
        def _evict(self, slot: Slot) -> None: ...
        def _save(self, slot: Slot, min_new: int | None = None) -> None: ...
        def free_slots(self) -> list[Slot]: ...
        def _window_ok(self, seq: int, at: int) -> bool: ...

    def _cut_needs_snapshot(self, held: int) -> bool:
        """A sequence holding ``held`` positions (loaded whole, e.g. from disk) cannot be
        cut back without a snapshot: its recurrent state is at its end, or its window
        layers keep only the last ``n_swa`` positions (from ``held - n_swa`` on, which is
        past the window any shorter prefix needs)."""
        return self.recurrent or 0 < self.n_swa < held

    def _snapshot_for(self, slot: Slot, n: int, r: Request | None) -> tuple[int, Snapshot | None]:
        """The furthest snapshot of ``slot`` within its first ``n`` positions."""
        if not self.snapshots_on:
            return 0, None
        for pos in reversed(self.snaps.positions(slot.seq_id)):
            if pos <= n and (r is None or r.reusable(pos) == pos):
                return pos, self.snaps.get(slot.seq_id, pos)
        return 0, None

    def _from_snapshot(self, r: Request, src: Slot, snap: Snapshot) -> tuple[Slot, int, str]:
        """Continue at ``snap.pos`` of ``src``: in place, or in a copy of its first
        ``snap.pos`` positions, with the partial state restored from the snapshot."""
        n = snap.pos
        # in place only when little is lost: past the snapshot, src's state is gone for good
        # (its next turn could only resume from the snapshot too)
        in_place = src.owner is None and (len(src.tokens) - n < SHORT_CACHE
                                          or len(self.free_slots()) == 1)
        dst = src if in_place else self._victim(keep=(src,))
        if not in_place:
            self._evict(dst)
        if not self._rewind(dst.seq_id, r, snap, None if in_place else src.seq_id,
                            f"sequence {src.seq_id}"):
            self._evict(dst)
            return dst, 0, ""
        if in_place:
            self.ledger.truncate(dst.seq_id, n)
            self.snaps.truncate(dst.seq_id, n)
            self._tree(dst.adapters).remove(dst.seq_id)
            dst.rolled_back = False
        else:
            self.ledger.copy(src.seq_id, dst.seq_id, n)
            self.snaps.share(src.seq_id, dst.seq_id, n)
        self.snaps.touch(snap)
        dst.tokens = r.prompt[:n]
        self._restored(n, "memory")
        if in_place or self.unified:
            self._save(dst)  # a prefix two prompts share is worth keeping across restarts
        return dst, n, "memory"

    def _rewind(self, seq: int, r: Request, snap: Snapshot, src: int | None, where: str
                ) -> bool:
        """Restore ``snap`` into ``seq`` (from ``src``'s KV if given) and check the result;
        a snapshot that fails is dropped everywhere."""
        n = snap.pos
        at = r.positions.next(n)
        if self.kv.seq_rewind(seq, at, snap.data, src, last=r.positions.last(n)) and (
                self.n_swa <= 0 or self._window_ok(seq, at)):
            return True
        self._snapshot_failed(snap, where)
        return False

    def _restored(self, n: int, source: str) -> None:
        if self.metrics is not None:
            self.metrics.snapshots_restored.labels(source).inc()
            self.metrics.snapshot_tokens_reused.inc(n)

    def _snapshot_failed(self, snap: Snapshot, where: str) -> None:
        log.warning("llama.cpp rejected the state snapshot at position %d of %s (or the "
                    "restored state is not where it was taken); dropped, the prompt is "
                    "evaluated", snap.pos, where)
        for seq in list(snap.holders):
            self.snaps.drop(seq, snap.pos)
        if self.metrics is not None:
            self.metrics.snapshots_failed.inc()

    def _snapshot_points(self, r: Request, start: int, shared: int) -> list[int]:
        """Where ``r``'s prefill snapshots its state: after the first message and the last
        few (an end-of-generation token ends a chat message, and so does each of
        ``r.message_ends``), where the prompt diverged
        from the cached sequences, and one token before the end; past ``start``, never
        inside a media, not closer than SNAPSHOT_MIN_GAP before a later one."""
        prompt, end = r.prompt, len(r.prompt) - 1
        ends = sorted({i + 1 for i in range(start, end) if prompt[i] >= 0 and
                       self.is_eog(prompt[i])} | {p for p in r.message_ends if start < p <= end})
        # most useful first: the first message (a new conversation with the same system
        # prompt), where the prompt left a cached one, the prompt's end (the same prompt
        # again), then the last messages (an agent's retried turn); a point closer than
        # SNAPSHOT_MIN_GAP to a more useful one is left out
        kept: list[int] = []
        for p in (*ends[:1], shared, end, *reversed(ends[-SNAPSHOT_LAST_MESSAGES:])):
            if start < p <= end and r.reusable(p) == p and all(
                    abs(p - q) >= SNAPSHOT_MIN_GAP for q in kept):
                kept.append(p)
        return sorted(kept)

    def _take_snapshot(self, slot: Slot) -> None:
        try:
            data = self.kv.state_get_partial(slot.seq_id)
        except Exception:  # a snapshot not taken costs a future cache hit, nothing else
            log.exception("could not snapshot the state of sequence %d", slot.seq_id)
            if self.metrics is not None:
                self.metrics.snapshots_failed.inc()
            return
        if self.snaps.add(slot.seq_id, len(slot.tokens), data) is not None \
                and self.metrics is not None:
            self.metrics.snapshots_taken.inc()
