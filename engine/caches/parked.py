"""Idle sequences parked in RAM, out of the KV pool (pure Python, no llama.cpp).

In one KV pool (``kv_unified``) every token's attention spans every cell in use, so a
finished request's sequence kept for a later turn slows every other sequence's decode
for as long as it stays: 8,000 cached cells took the tiny llama from ~1,150 to ~900
tokens/s at one stream, and Qwen2.5 0.5B's decode without flash attention from ~40 to
~80 ms. When a request is admitted, the prefix cache therefore moves every other idle
sequence's state (``llama_state_seq_get_data``, with its state snapshots) here and
clears its cells, as llama-server does with its idle slots (``--cache-idle-slots``). A
later prompt sharing a prefix with a parked sequence gets it back
(``llama_state_seq_set_data``, then cut where the prompt diverges) instead of evaluating
it again: a memory copy.

Entries are indexed in a radix tree per LoRA adapter set (KV computed under one set is
never reused under another). A parked sequence that another one extends (the same
conversation, parked again a turn later) is dropped; the total stays under
``max_bytes``, least recently used first. Only the engine thread uses it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from engine.caches.prefix_tree import PrefixTree
from engine.metrics import EngineMetrics

Adapters = tuple[tuple[str, float], ...]


@dataclass(eq=False)
class Parked:
    tokens: list[int]
    adapters: Adapters
    state: bytearray  # llama_state_seq_get_data of a sequence holding exactly ``tokens``
    snapshots: dict[int, bytes]  # state snapshots taken at these positions (< len(tokens))
    last_used: int = 0

    @property
    def size(self) -> int:
        return len(self.state) + sum(len(s) for s in self.snapshots.values())


class ParkedSequences:
    def __init__(self, max_bytes: int, metrics: EngineMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.bytes = 0
        self._entries: dict[int, Parked] = {}
        self._trees: dict[Adapters, PrefixTree[int]] = {}
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        self._pinned: set[int] = set()  # (pin_sharing)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Parked]:
        return list(self._entries.values())

    def _tree(self, adapters: Adapters) -> PrefixTree[int]:
        return self._trees.setdefault(adapters, PrefixTree())

    def fits(self, n_bytes: int) -> bool:
        return 0 < n_bytes <= self.max_bytes

    def put(self, tokens: list[int], adapters: Adapters, state: bytearray,
            snapshots: dict[int, bytes]) -> bool:
        """Park a sequence holding ``tokens``; parked sequences it extends are dropped, then
        the least recently used ones but the pinned until it fits. False: not parked (it
        does not fit beside the pinned entries)."""
        entry = Parked(list(tokens), adapters, state, snapshots, next(self._clock))
        if not self.fits(entry.size):
            return False
        tree = self._tree(adapters)
        for _, key in tree.stored_prefixes(tokens):
            if key not in self._pinned:
                self._drop(key)
        key = next(self._ids)
        self._entries[key] = entry
        tree.insert(key, entry.tokens)
        self.bytes += entry.size
        while self.bytes > self.max_bytes:
            self._drop(min((k for k in self._entries if k not in self._pinned),
                           key=lambda k: self._entries[k].last_used))
        self._gauges()
        return key in self._entries

    def sharing(self, tokens: list[int], adapters: Adapters
                ) -> list[tuple[int, int, list[int]]]:
        """Parked sequences sharing a prefix with ``tokens``: (shared length, key, their
        tokens), most shared first and, among equals, the shortest to restore."""
        tree = self._trees.get(adapters)
        if tree is None:
            return []
        found = [(n, key, self._entries[key].tokens)
                 for key, n in tree.common_prefixes(tokens).items() if n > 0]
        found.sort(key=lambda e: (-e[0], len(e[2])))
        return found

    def pin_sharing(self, tokens: list[int], adapters: Adapters, most: int = 4) -> None:
        """Until the next call, the ``most`` entries sharing the longest prefixes with
        ``tokens`` are not pushed out to make room (a prompt about to load one must not
        see it dropped by the parking of others first)."""
        self._pinned = {key for _, key, _ in self.sharing(tokens, adapters)[:most]}

    def snapshot_positions(self, key: int) -> tuple[int, ...]:
        entry = self._entries.get(key)
        return tuple(sorted(entry.snapshots)) if entry is not None else ()

    def read_entry(self, key: int, tokens: list[int]
                   ) -> tuple[bytearray, dict[int, bytes]] | None:
        """The state and snapshots of entry ``key`` (which holds ``tokens``)."""
        entry = self._entries.get(key)
        if entry is None or entry.tokens != tokens:
            return None
        entry.last_used = next(self._clock)
        return entry.state, entry.snapshots

    def taken(self, key: int) -> None:
        """Entry ``key`` is back in the KV pool whole: the pool's copy is the one kept."""
        self._drop(key)
        self._gauges()

    def discard(self, key: int, reason: str) -> None:
        self._drop(key)
        self._gauges()

    def hit(self) -> None:
        if self.metrics is not None:
            self.metrics.parked_restored.inc()

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._tree(entry.adapters).remove(key)
            self.bytes -= entry.size

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.parked_bytes.set(self.bytes)
            self.metrics.parked_sequences.set(len(self._entries))
