"""Which llama.cpp sequence a request runs in, and how much of its prompt is already there.

Every sequence id is a slot. A slot owned by a running request is busy; a free
slot keeps its KV (prompt and generated tokens) until the space is needed,
least recently used first, so a follow-up turn seconds later still hits. A
radix tree indexes what each slot holds (a busy slot by its prompt), and a new
request reuses the longest common prefix of any slot:

- a free slot that shares most of its content is reused in place (its tail is
  removed with ``seq_rm``);
- otherwise the prefix is copied (``seq_cp``) into the least recently used free
  slot, also while the source is still busy; when the source is still
  prefilling the shared part, the request waits for it instead of recomputing it;
- on a miss in memory, the sequence parked in RAM or stored on disk sharing the longest
  prefix is loaded and cut where the prompt diverges (``engine.caches.stored_paths``).

In one KV pool every cell in use widens every decode's attention, so when a request is
admitted every other idle sequence is parked in RAM (``engine.caches.parked``) and its cells
are cleared, as llama-server does with its idle slots.

KV computed under one set of LoRA adapters is never reused under another: each adapter
set has its own tree, and the disk cache (whose key covers the configured adapters)
serves only requests with the configured set.

Recurrent or hybrid memory (Mamba, RWKV, Gated DeltaNet layers as in Qwen3.5) keeps one
state per sequence, at its last position, and cannot go back: such a sequence is reused
only whole. A cached or busy sequence serves a prompt it is all a prefix of, never
part of it (no ``seq_rm`` of a tail, no ``seq_cp`` of a shorter prefix: llama.cpp would
hand over the state at the source's last position); a disk entry is loaded only when it
is all a prefix of the prompt; a sequence whose state waits for a draft rollback (applied
by its next decode) is neither copied, saved nor kept.

Sliding-window attention without ``swa_full`` (Gemma 3, gpt-oss) keeps only the last
``n_swa`` positions of its window layers: a sequence serves a prefix ``p`` only while it
holds the window before ``p`` (continuing at its end always works; cutting far back does
not).

Snapshots lift most of both limits (``engine.caches.snapshot_paths``,
``engine.caches.snapshots``, ``model.state_snapshots_max_bytes``):
at admission a request gets ``snapshot_at``, prompt positions agents come back to — the end
of each message (right after an end-of-generation token such as ``<|im_end|>``, or where the
API marks a system prompt's text ending inside the first turn: the first,
the system prompt, and the last few), where the prompt diverged from every cached sequence,
and one token before its end — and the scheduler ends a prefill chunk at each, so
``committed`` copies the partial state (the recurrent state, or the window layers' window;
never the full attention KV) right after that decode.
A sequence sharing at least ``p`` tokens with a later prompt then serves it from its
snapshot at ``p``: in place (the snapshot restored, the attention KV cut at ``p``) or by copy
(the attention KV ``[0, p)`` copied, the snapshot restored into the copy). Snapshots are
saved with the sequence's disk entry and serve a load from disk the same way. A snapshot
llama.cpp refuses, or whose restored state is not where it was taken, is dropped (logged,
counted) and the prompt is evaluated. ``_usable`` is the one rule every reuse follows.

Everything here counts tokens (KV cells); llama.cpp cuts and copies by position. With
M-RoPE media (``engine.media.spans.PositionMap``) the two differ, and every cut or copy
at ``n`` tokens goes through the request's own map: positions depend only on the tokens
before ``n``, so the request's map is right for whichever cached sequence, busy source or
disk entry shares those tokens with it.

At least one prompt token is always evaluated, so there are logits to sample.
The module is pure Python: llama.cpp is reached through ``KvOps``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.caches.kv_ledger import KvLedger
from engine.caches.parked import ParkedSequences
from engine.caches.prefix_tree import PrefixTree
from engine.caches.snapshot_paths import SHORT_CACHE, SnapshotPaths
from engine.caches.snapshots import Snapshot, SnapshotStore
from engine.caches.stored_paths import StoredPaths
from engine.request import Request

if TYPE_CHECKING:
    from engine.caches.disk_cache import DiskCache
    from engine.metrics import EngineMetrics

log = logging.getLogger("llamaserve.prefix_cache")

WAIT_FOR_SOURCE_MIN = 64  # wait for a busy slot's prefill when it would save this many tokens
# A finished request's sequence (prompt + answer) is saved again when the answer adds this
# many tokens to what is stored: the next turn of a conversation starts with the answer.
ANSWER_MIN_SAVE = 16


class KvOps(Protocol):
    """The KV operations the cache needs (implemented by ``engine.runner.Runner``)."""

    @property
    def recurrent(self) -> bool: ...  # recurrent or hybrid memory: see the module doc
    def seq_trim(self, seq: int, keep: int) -> bool: ...  # drop positions >= keep
    def seq_copy(self, src: int, dst: int, n: int) -> bool: ...  # dst := positions < n of src
    def seq_clear(self, seq: int) -> None: ...
    def seq_pos_min(self, seq: int) -> int: ...
    def state_get(self, seq: int) -> bytearray: ...
    def state_size(self, seq: int) -> int: ...  # (an upper bound of state_get's bytes)
    def state_set(self, seq: int, data: bytearray) -> bool: ...
    # snapshots: the partial state only (recurrent state, SWA window), and its restore
    def state_get_partial(self, seq: int) -> bytes: ...
    # (n: the position to continue at; last: the highest position kept, n - 1 unless media
    # end there)
    def seq_rewind(self, seq: int, n: int, data: bytes, src: int | None = None,
                   last: int | None = None) -> bool: ...


@dataclass(eq=False)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what this sequence's KV holds
    owner: Request | None = None
    last_used: int = 0
    adapters: tuple[tuple[str, float], ...] = ()  # the LoRA set its KV was computed under
    rolled_back: bool = False  # recurrent state: a draft rollback waits for the next decode
    stays: bool = False  # idle, and could not be parked (too large, or its copy failed)


@dataclass(frozen=True)
class _Match:
    slot: Slot | None = None
    usable: int = 0  # tokens that can be reused now
    wait: bool = False  # a busy slot is still computing a longer shared prefix
    snap: Snapshot | None = None  # usable through this snapshot (recurrent state, window)
    shared: int = 0  # the longest prefix any sequence shares with the prompt


class PrefixCache(SnapshotPaths, StoredPaths):
    def __init__(self, n_seq: int, kv: KvOps, *, capacity: int, unified: bool = True,
                 n_swa: int = 0, disk: DiskCache | None = None,
                 metrics: EngineMetrics | None = None,
                 disk_adapters: tuple[tuple[str, float], ...] = (),
                 snapshot_bytes: int = 0, parked_bytes: int = 0,
                 is_eog: Callable[[int], bool] | None = None) -> None:
        self.slots = [Slot(i) for i in range(n_seq)]
        self.kv = kv
        # tokens that end a message: where snapshots are taken (none known: no snapshots)
        self.is_eog = is_eog or (lambda token: False)
        self.capacity = capacity
        self.unified = unified
        self.n_swa = n_swa
        self.disk = disk
        self.metrics = metrics
        self.trees: dict[tuple[tuple[str, float], ...], PrefixTree[int]] = {}
        self.disk_adapters = disk_adapters  # the adapter set the disk cache's key covers
        # one pool: idle sequences parked in RAM when another request starts
        self.parked = ParkedSequences(parked_bytes, metrics) if unified and parked_bytes > 0 \
            else None
        self.ledger = KvLedger()
        self.recurrent = kv.recurrent  # one state per sequence: reused only whole
        self.snaps = SnapshotStore(snapshot_bytes, metrics)  # ...or from a snapshot
        # (so is a sliding window: engine.caches.snapshot_paths)
        self.snapshots_on = (self.recurrent or n_swa > 0) and snapshot_bytes > 0
        self._clock = itertools.count(1)
        self._owner_changes = 0  # slots taken or given back (split KV counts owned slots)
        self._exact = (-1, -1, 0, 0)  # cells_used()'s last count, with what it depended on

    def _tree(self, adapters: tuple[tuple[str, float], ...]) -> PrefixTree[int]:
        tree = self.trees.get(adapters)
        if tree is None:
            tree = self.trees[adapters] = PrefixTree()
        return tree

    # -- accounting -------------------------------------------------------------
    def cells_used(self) -> int:
        if self.unified:
            used = self.ledger.cells()
        else:  # one stream per sequence: a free slot's cache does not take others' cells
            used = self.ledger.cells({s.seq_id for s in self.slots if s.owner is not None})
        self._exact = (self.ledger.changes, self._owner_changes, self.ledger.appended, used)
        return used

    def cells_bound(self) -> int:
        """At least ``cells_used()``, without walking the ledger while decoding only
        appends: the last exact count plus the cells appended since (any other change to
        the ledger or to which slots are owned makes it count again)."""
        changes, owners, appended, used = self._exact
        if changes != self.ledger.changes or owners != self._owner_changes:
            return self.cells_used()
        return used + self.ledger.appended - appended

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.owner is None]

    def evict_lru(self, keep: tuple[Slot, ...] = ()) -> bool:
        """Drop the least recently used free slot's KV; False when that frees nothing."""
        if not self.unified:
            return False
        cached = [s for s in self.free_slots() if s.tokens and s not in keep]
        if not cached:
            return False
        self._evict(min(cached, key=lambda s: s.last_used))
        return True

    def _evict(self, slot: Slot) -> None:
        slot.stays = False
        self.kv.seq_clear(slot.seq_id)
        self.snaps.clear(slot.seq_id)
        slot.rolled_back = False
        self.ledger.clear(slot.seq_id)
        self._tree(slot.adapters).remove(slot.seq_id)
        slot.tokens = []

    def _room(self, need: int, reserved: int, keep: tuple[Slot, ...]) -> bool:
        if self.cells_used() + reserved + need > self.capacity:
            self.park_idle(keep)  # (idle sequences are kept in RAM before any is dropped)
        while self.cells_used() + reserved + need > self.capacity:
            if not self.evict_lru(keep):
                return False
        return True

    # -- admission --------------------------------------------------------------
    def admit(self, r: Request, reserved: int) -> bool:
        """Give ``r`` a slot holding as much of its prompt as possible, if there is a free
        slot and room for the rest of the prompt plus one generated token. ``reserved`` is
        what running sequences still need. On False, ``r`` stays waiting."""
        if not self.free_slots():
            return False
        reuse = r.params.cache_prompt and not r.params.prompt_logprobs  # those need every logit
        match = self._match(r)
        if match.wait and reuse:
            return False
        placed = None
        keep = (match.slot,) if match.slot else ()
        if self.parked is not None and reuse:  # what this prompt may load stays in RAM...
            self.parked.pin_sharing(r.prompt, r.adapters)
        self.park_idle(keep)  # ...while idle sequences are parked before any is dropped
        if reuse:
            placed = self._from_stored(r, match.usable, reserved, keep)
            if placed is None and match.slot is not None and \
                    len(match.slot.tokens) < match.usable:  # a failed load cleared it
                match = self._match(r)
                if match.wait:
                    return False
        if placed is None and not reuse:
            # evaluate everything, but in the slot holding the most similar content, so the
            # KV does not fill with a second copy of it (every cell in use costs attention)
            slot = match.slot if match.slot is not None and match.slot.owner is None \
                else self._victim()
            self._evict(slot)
            placed = slot, 0, ""
        if placed is None:
            placed = self._from_memory(r, match)
        slot, reused, source = placed
        slot.adapters = r.adapters  # its tree from now on (a victim was evicted from its old)
        if not self._room(len(r.prompt) - reused + 1, reserved, keep=(slot,)):
            self.release_slot(slot, keep=True)  # it holds the prefix for the next attempt
            return False
        slot.owner = r
        self._owner_changes += 1
        slot.last_used = next(self._clock)
        self._tree(r.adapters).insert(slot.seq_id, r.prompt)
        r.seq_id = slot.seq_id
        r.num_computed = reused
        r.snapshot_at = self._snapshot_points(r, reused, match.shared) \
            if self.snapshots_on and r.params.cache_prompt else []
        slot.stays = False
        self.park_idle((slot,))  # the matched sequence too, when it was not the one used
        if r.suspensions:  # back after giving its sequence up: the reuse is its own work
            return True
        r.cached_tokens = reused
        if self.metrics is not None and reused:
            self.metrics.prompt_tokens_cached.labels(source).inc(reused)
        return True

    def _match(self, r: Request) -> _Match:
        prompt = r.prompt
        limit = len(prompt) - 1  # at least one token is evaluated
        best = _Match()
        best_key = (0, False, False)
        longest_pending = shared = 0
        for seq, common in self._tree(r.adapters).common_prefixes(prompt).items():
            if common <= 0:
                continue
            shared = max(shared, min(common, limit))
            slot = self.slots[seq]
            usable, snap = self._usable(slot, r.reusable(min(common, limit, len(slot.tokens))),
                                        r)
            if slot.owner is not None and common > len(slot.tokens):
                longest_pending = max(longest_pending, min(common, limit))
            # the most tokens; among equals the whole sequence (no restore), then a free one
            key = (usable, snap is None, slot.owner is None)
            if usable > 0 and key > best_key:
                best, best_key = _Match(slot, usable, snap=snap), key
        # (a recurrent state passes the shared prefix mid-prefill: nothing to wait for)
        if not self.recurrent and longest_pending - best.usable >= WAIT_FOR_SOURCE_MIN:
            return _Match(wait=True)
        return _Match(best.slot, best.usable, snap=best.snap, shared=shared)

    def _usable(self, slot: Slot, n: int, r: Request | None = None
                ) -> tuple[int, Snapshot | None]:
        """How much of ``n`` shared positions of ``slot`` can be reused: all of them while
        the memory is there (a recurrent state only whole: ``n`` must be all the sequence
        holds; sliding-window layers only while they keep the window before ``n``),
        otherwise up to the furthest snapshot within ``n``. The one rule every reuse
        follows (memory, copies, disk)."""
        if n <= 0:
            return 0, None
        if self.recurrent:
            if n == len(slot.tokens) and not slot.rolled_back:
                return n, None
        elif self.n_swa <= 0 or self._window_ok(
                slot.seq_id, r.positions.next(n) if r is not None else n):
            return n, None
        return self._snapshot_for(slot, n, r)

    def _window_ok(self, seq: int, at: int) -> bool:
        """Sliding-window layers of ``seq`` hold what continuing at position ``at`` needs:
        the window before it (llama.cpp keeps only the last ``n_swa`` positions)."""
        pos_min = self.kv.seq_pos_min(seq)
        return 0 <= pos_min <= max(0, at - self.n_swa)

    def _victim(self, keep: tuple[Slot, ...] = ()) -> Slot:
        """The free slot to clear: short cached content first, then an empty slot, then the
        least recently used long content."""
        free = [s for s in self.free_slots() if s not in keep] or self.free_slots()
        return min(free, key=lambda s: (len(s.tokens) >= SHORT_CACHE, not s.tokens,
                                        s.last_used))

    def _from_memory(self, r: Request, m: _Match) -> tuple[Slot, int, str]:
        src, n = m.slot, m.usable
        if src is None or n == 0:
            dst = self._victim()
            self._evict(dst)
            return dst, 0, ""
        if m.snap is not None:
            return self._from_snapshot(r, src, m.snap)
        in_place = src.owner is None and (2 * n >= len(src.tokens) or len(src.tokens) < SHORT_CACHE
                                          or len(self.free_slots()) == 1)
        diverges = n < len(src.tokens)
        if in_place:
            dst = src
            if n < len(dst.tokens) and not self.kv.seq_trim(dst.seq_id, r.positions.next(n)):
                self._evict(dst)  # llama.cpp cannot cut this memory (recurrent state)
                return dst, 0, ""
            self.ledger.truncate(dst.seq_id, n)
            self.snaps.truncate(dst.seq_id, n)
            self._tree(dst.adapters).remove(dst.seq_id)
        else:
            dst = self._victim(keep=(src,))
            self._evict(dst)
            if not self.kv.seq_copy(src.seq_id, dst.seq_id, r.positions.next(n)):
                self._evict(dst)
                return dst, 0, ""
            self.ledger.copy(src.seq_id, dst.seq_id, n)
        dst.tokens = r.prompt[:n]
        if diverges and (in_place or self.unified):
            self._save(dst)  # a prefix two prompts share is worth keeping across restarts
        return dst, n, "memory"

    # -- progress and release -----------------------------------------------------
    def committed(self, r: Request, tokens: list[int]) -> None:
        slot = self.slots[r.seq_id]
        slot.tokens.extend(tokens)
        slot.rolled_back = False
        self.ledger.append(r.seq_id, len(tokens))
        if r.snapshot_at and len(slot.tokens) in r.snapshot_at:
            self._take_snapshot(slot)

    def trim(self, r: Request, n: int) -> None:
        """Keep the first ``n`` tokens of ``r``'s sequence (rejected draft tokens go)."""
        slot = self.slots[r.seq_id]
        if n >= len(slot.tokens):
            return
        if not self.kv.seq_trim(slot.seq_id, r.positions.next(n)):
            raise RuntimeError("llama.cpp cannot remove rejected draft tokens from this memory")
        self.ledger.truncate(slot.seq_id, n)
        self.snaps.truncate(slot.seq_id, n)
        del slot.tokens[n:]
        # llama.cpp restores a recurrent state's snapshot only in the sequence's next decode:
        # until then a copy of it (or its saved state) would have read the rejected tokens
        slot.rolled_back = self.recurrent

    def prefill_done(self, r: Request) -> None:
        """The sequence holds exactly the prompt: save it to disk if that is worth it."""
        self._save(self.slots[r.seq_id])

    def release(self, r: Request, keep: bool) -> None:
        """The request is done with its slot; keep its KV for later requests unless told not
        to (its content is unknown after a failed step, or the cells are needed now).
        A kept sequence goes to disk too when its answer is new there: a follow-up turn
        evicted from memory in the meantime then reloads the answer with the prompt."""
        slot = self.slots[r.seq_id]
        if keep and r.output and slot.tokens:
            self._save(slot, ANSWER_MIN_SAVE)
        self.release_slot(slot, keep)

    def release_slot(self, slot: Slot, keep: bool) -> None:
        slot.owner = None
        slot.stays = False  # (its content may have changed: parking is tried again)
        self._owner_changes += 1
        slot.last_used = next(self._clock)
        if keep and slot.tokens and not slot.rolled_back:
            self._tree(slot.adapters).insert(slot.seq_id, slot.tokens)
        else:
            self._evict(slot)
