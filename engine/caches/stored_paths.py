"""The prefix cache's paths to sequences stored outside the KV pool (pure Python): parking
idle sequences in RAM (``engine.caches.parked``), saving them to disk
(``engine.caches.disk_cache``), and loading the one sharing the longest prefix with a
prompt back into a sequence, cut where the prompt diverges. ``PrefixCache``
(``engine.caches.prefix_cache``) mixes them in and decides when they are used.

A parked sequence and a disk entry are loaded the same way (``llama_state_seq_set_data``
into a cleared sequence id), and a recurrent state or a sliding window cut back through a
snapshot stored with it, as ``_usable`` allows; RAM is tried first when it shares as much.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from engine.caches.kv_ledger import KvLedger
from engine.caches.parked import ParkedSequences
from engine.caches.snapshots import Snapshot, SnapshotStore
from engine.request import Request

if TYPE_CHECKING:
    from engine.caches.disk_cache import DiskCache
    from engine.caches.prefix_cache import KvOps, Slot
    from engine.metrics import EngineMetrics

log = logging.getLogger("llamaserve.prefix_cache")

STORED_MIN_GAIN = 16  # load a stored sequence only when it beats memory by this many tokens
STORED_MIN_SHARE = 0.25  # ...and uses at least this share of it
PARK_MIN = 16  # park an idle sequence when it holds at least this many cells no busy one holds


class _Store(Protocol):
    """What loading needs of a store (``DiskCache``, ``ParkedSequences``)."""

    def snapshot_positions(self, key: Any) -> tuple[int, ...]: ...
    def read_entry(self, key: Any, tokens: list[int]
                   ) -> tuple[bytearray, dict[int, bytes]] | None: ...
    def discard(self, key: Any, reason: str) -> None: ...
    def hit(self) -> None: ...


class StoredPaths:
    """Mixed into ``PrefixCache``: the attributes and methods below are its own."""

    slots: list[Slot]
    kv: KvOps
    snaps: SnapshotStore
    ledger: KvLedger
    metrics: EngineMetrics | None
    disk: DiskCache | None
    disk_adapters: tuple[tuple[str, float], ...]
    parked: ParkedSequences | None
    unified: bool
    snapshots_on: bool

    if TYPE_CHECKING:
        def _victim(self, keep: tuple[Slot, ...] = ()) -> Slot: ...
        def _evict(self, slot: Slot) -> None: ...
        def _room(self, need: int, reserved: int, keep: tuple[Slot, ...]) -> bool: ...
        def _usable(self, slot: Slot, n: int, r: Request | None = None
                    ) -> tuple[int, Snapshot | None]: ...
        def _cut_needs_snapshot(self, held: int) -> bool: ...
        def _rewind(self, seq: int, r: Request, snap: Snapshot, src: int | None, where: str
                    ) -> bool: ...
        def _restored(self, n: int, source: str) -> None: ...
        def free_slots(self) -> list[Slot]: ...

    # -- parking ------------------------------------------------------------------------
    def park_idle(self, keep: tuple[Slot, ...]) -> None:
        """Move every idle sequence but ``keep`` out of one KV pool into RAM: in one pool each
        cell in use widens every decode's attention. A sequence holding fewer than PARK_MIN
        cells of its own (the rest shared with busy ones) stays; so does one whose state
        waits for a draft rollback, and one that could not be parked (``Slot.stays``: its
        state is larger than the whole budget, or copying it failed) until it is used
        again."""
        if self.parked is None or not self.unified:
            return
        idle = [s for s in self.free_slots()
                if s.tokens and s not in keep and not s.rolled_back and not s.stays]
        if not idle:
            return
        busy = {s.seq_id for s in self.slots if s.owner is not None or s in keep}
        held_by_busy = self.ledger.cells(busy)
        for slot in idle:
            if self.ledger.cells(busy | {slot.seq_id}) - held_by_busy < PARK_MIN:
                continue
            slot.stays = True  # (unless parked below)
            if not self.parked.fits(self.kv.state_size(slot.seq_id)):
                continue  # larger than the whole budget: it stays in the pool
            try:
                state = self.kv.state_get(slot.seq_id)
            except Exception:  # not parked: it stays in the pool, nothing is lost
                log.exception("could not copy the state of sequence %d", slot.seq_id)
                continue
            snapshots = dict(self._stored_snapshots(slot))
            if not self.parked.fits(len(state) + sum(map(len, snapshots.values()))):
                continue
            if self.parked.put(slot.tokens, slot.adapters, state, snapshots):
                self._evict(slot)

    def _stored_snapshots(self, slot: Slot) -> tuple[tuple[int, bytes], ...]:
        return tuple((p, s.data) for p in self.snaps.positions(slot.seq_id)
                     if p < len(slot.tokens) and (s := self.snaps.get(slot.seq_id, p)))

    # -- saving -------------------------------------------------------------------------
    def _save(self, slot: Slot, min_new: int | None = None) -> None:
        if self.disk is not None and slot.adapters == self.disk_adapters \
                and not slot.rolled_back and self.disk.wants(slot.tokens, min_new):
            try:
                self.disk.put(slot.tokens, self.kv.state_get(slot.seq_id),
                              self._stored_snapshots(slot))
            except Exception:  # a failed save costs a future cache hit, nothing else
                log.exception("could not serialize sequence %d for the disk cache", slot.seq_id)

    def save_all(self) -> None:
        """Save every cached and parked sequence the disk cache wants (at shutdown or
        unload; the engine thread has stopped)."""
        for slot in self.slots:
            if slot.tokens:
                self._save(slot)
        if self.disk is None or self.parked is None:
            return
        for entry in self.parked.entries():
            if entry.adapters == self.disk_adapters and self.disk.wants(entry.tokens):
                self.disk.put(entry.tokens, entry.state, tuple(sorted(entry.snapshots.items())))

    # -- loading ------------------------------------------------------------------------
    def _from_stored(self, r: Request, in_memory: int, reserved: int,
                     keep: tuple[Slot, ...]) -> tuple[Slot, int, str] | None:
        """Load the parked or disk-stored sequence sharing the longest prefix with the
        prompt (RAM first among equals), then cut it where the prompt diverges."""
        stores: list[tuple[int, int, _Store, list[tuple[int, Any, list[int]]], str]] = []
        if self.parked is not None:
            found: list[tuple[int, Any, list[int]]] = [
                *self.parked.sharing(r.prompt, r.adapters)]
            if found:
                stores.append((found[0][0], 1, self.parked, found, "ram"))
        if self.disk is not None and r.adapters == self.disk_adapters:
            found = [*self.disk.sharing(r.prompt)]
            if found:
                stores.append((found[0][0], 0, self.disk, found, "disk"))
        for _, _, store, found, source in sorted(stores, key=lambda s: (-s[0], -s[1])):
            placed = self._load(r, in_memory, reserved, keep, store, found, source)
            if placed is not None:
                return placed
        return None

    def _load(self, r: Request, in_memory: int, reserved: int, keep: tuple[Slot, ...],
              store: _Store, found: list[tuple[int, Any, list[int]]], source: str
              ) -> tuple[Slot, int, str] | None:
        """One store's entries, most shared first (a prompt saved by another turn, or
        another replica, with the same system prompt and tools but another question still
        serves them)."""
        for shared, name, stored in found:
            if shared < in_memory + STORED_MIN_GAIN:
                return None
            if STORED_MIN_SHARE * len(stored) > shared:
                continue  # mostly another conversation: loading it costs more than it saves
            n = r.reusable(min(shared, len(r.prompt) - 1))
            # a recurrent state or a window: cut back through a snapshot stored with it
            rewind = n < len(stored) and self._cut_needs_snapshot(len(stored))
            if rewind:
                if not self.snapshots_on:
                    continue
                n = max((p for p in store.snapshot_positions(name)
                         if p <= n and r.reusable(p) == p), default=0)
                if n < in_memory + STORED_MIN_GAIN:
                    continue
            got = store.read_entry(name, stored)  # (before _room, which may park others and
            if got is None:  # so push this entry out of RAM)
                continue
            if not self._room(len(stored) + 1, reserved, keep):
                return None
            data, snapshots = got
            dst = self._victim(keep)
            self._evict(dst)
            if not self.kv.state_set(dst.seq_id, data):
                log.warning("llama.cpp rejected %s cache entry %s", source, name)
                store.discard(name, "corrupt")
                self._evict(dst)
                continue
            self.ledger.append(dst.seq_id, len(stored))
            dst.tokens = list(stored)
            if self.snapshots_on:
                for pos in sorted(snapshots, key=lambda p: (p == n, p)):  # n's kept last
                    self.snaps.add(dst.seq_id, pos, snapshots[pos])
            if rewind:
                if not self._stored_snapshot(dst, r, n, f"{source} cache entry {name}", source):
                    self._evict(dst)
                    continue
            elif n < len(stored):  # diverges (or the whole prompt was stored): cut there
                if self._usable(dst, n, r)[0] < n or not self.kv.seq_trim(
                        dst.seq_id, r.positions.next(n)):
                    self._evict(dst)
                    return None
                self.ledger.truncate(dst.seq_id, n)
                self.snaps.truncate(dst.seq_id, n)  # (the stored sequence's, past the cut)
                dst.tokens = dst.tokens[:n]
            elif self.parked is not None and store is self.parked:
                self.parked.taken(int(name))  # back whole: the pool's copy is the one kept
            store.hit()
            return dst, n, source
        return None

    def _stored_snapshot(self, dst: Slot, r: Request, n: int, where: str, source: str
                         ) -> bool:
        """``dst`` holds a stored entry whole: cut it back to ``n`` through the snapshot
        stored with it."""
        snap = self.snaps.get(dst.seq_id, n)
        if snap is None or not self._rewind(dst.seq_id, r, snap, None, where):
            return False
        self.ledger.truncate(dst.seq_id, n)
        self.snaps.truncate(dst.seq_id, n)
        dst.tokens = dst.tokens[:n]
        self._restored(n, source)
        return True
