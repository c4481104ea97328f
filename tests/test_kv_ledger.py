"""Cells in use when sequences share cells through copies."""

from __future__ import annotations

from engine.caches.kv_ledger import KvLedger


def test_copies_share_cells_and_tails_are_separate() -> None:
    k = KvLedger()
    k.append(0, 100)
    k.copy(0, 1, 60)
    assert k.cells() == 100 and k.length(1) == 60
    k.append(1, 10)  # new cells for seq 1
    k.append(0, 5)
    assert k.cells() == 115
    k.clear(0)  # seq 1 still holds the first 60 of the original run
    assert k.cells() == 70 and k.cells([1]) == 70


def test_truncate_then_append_does_not_reclaim_a_shared_tail() -> None:
    k = KvLedger()
    k.append(0, 50)
    k.copy(0, 1, 50)
    k.truncate(0, 20)
    k.append(0, 10)  # seq 0's new positions 20..29 are new cells; seq 1 keeps 50
    assert k.cells() == 60
    k.clear(1)
    assert k.cells() == 30
