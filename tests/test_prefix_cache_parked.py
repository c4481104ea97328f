"""Idle sequences parked in RAM out of one KV pool, and brought back (no model: FakeKv).

Each property is checked against what the fake KV actually holds: a parked sequence's cells
are gone from the pool, what comes back is what was parked, and the cache's bookkeeping
stays in step with the KV (``check_in_sync``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_prefix_cache import check_in_sync, req, run_to_end, step

from engine.caches.disk_cache import DiskCache
from engine.caches.prefix_cache import PrefixCache
from engine.caches.stored_paths import PARK_MIN
from engine.config import DiskCacheConfig
from engine.scheduler import Scheduler
from fake_kv import FakeKv

A = list(range(100, 1600))  # a 1,500-token conversation
B = list(range(5000, 5300))  # another one


def make(parked: int = 1 << 30, unified: bool = True, kv: FakeKv | None = None,
         n_swa: int = 0, snapshots: int = 0, disk: DiskCache | None = None,
         n_seq: int = 4) -> tuple[Scheduler, FakeKv]:
    kv = kv or FakeKv()
    cache = PrefixCache(n_seq, kv, capacity=100_000, unified=unified, n_swa=n_swa,
                        parked_bytes=parked, snapshot_bytes=snapshots, is_eog=kv.is_eog,
                        disk=disk)
    return Scheduler(cache, 4096), kv


def pool_cells(kv: FakeKv) -> int:
    return sum(len(p) for p in kv.seqs.values())


def test_an_idle_sequence_leaves_the_pool_when_another_request_starts() -> None:
    s, kv = make()
    a = req(A)
    run_to_end(s, kv, a)
    assert kv.held(a.seq_id) == 1502  # kept in the pool while nothing else runs
    b = req(B)
    s.add(b)
    step(s, kv)
    assert kv.held(a.seq_id) == 0 and pool_cells(kv) == kv.held(b.seq_id)
    assert s.cache.parked is not None and len(s.cache.parked) == 1
    check_in_sync(s, kv)


def test_the_next_turn_of_a_parked_conversation_comes_back_whole() -> None:
    s, kv = make()
    a = req(A)
    run_to_end(s, kv, a)
    run_to_end(s, kv, req(B))  # parks a
    held = [*A, 7, 7]
    c = req([*held, 5, 5, 5])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens == len(held)
    assert kv.seqs[c.seq_id][:len(held)] == list(range(len(held)))
    assert s.cache.parked is not None
    # back whole: RAM holds only what is still parked (b, parked when c started)
    assert [e.tokens[:1] for e in s.cache.parked.entries()] == [B[:1]]
    check_in_sync(s, kv)


def test_a_prompt_diverging_from_a_parked_sequence_gets_its_prefix_and_ram_keeps_it() -> None:
    s, kv = make()
    run_to_end(s, kv, req(A))
    run_to_end(s, kv, req(B))
    c = req([*A[:1000], 1, 2, 3])
    s.add(c)
    plan = step(s, kv)
    assert c.cached_tokens == 1000 and plan.items[0].pos == 1000
    assert kv.held(c.seq_id) == 1003
    assert s.cache.parked is not None
    assert any(len(e.tokens) == 1502 for e in s.cache.parked.entries())  # still whole in RAM
    check_in_sync(s, kv)


def test_a_sequence_sharing_its_cells_with_a_busy_one_stays() -> None:
    s, kv = make()
    a = req(A)
    run_to_end(s, kv, a)
    b = req([*A[:1480], 9, 9, 9])  # copies a's first 1480 cells? a keeps them in place
    s.add(b)
    step(s, kv)
    idle = [x for x in s.cache.slots if x.owner is None and x.tokens]
    for slot in idle:  # what stayed holds fewer than PARK_MIN cells of its own
        own = s.cache.ledger.cells() - s.cache.ledger.cells(
            {x.seq_id for x in s.cache.slots if x is not slot})
        assert own < PARK_MIN
    check_in_sync(s, kv)


def test_a_split_pool_parks_nothing() -> None:
    s, kv = make(unified=False)
    a = req(A)
    run_to_end(s, kv, a)
    run_to_end(s, kv, req(B))
    assert kv.held(a.seq_id) == 1502 and s.cache.parked is None


def test_off_when_the_budget_is_zero_and_too_large_entries_stay_in_the_pool() -> None:
    s, kv = make(parked=0)
    a = req(A)
    run_to_end(s, kv, a)
    run_to_end(s, kv, req(B))
    assert kv.held(a.seq_id) == 1502 and s.cache.parked is None
    s, kv = make(parked=100)  # smaller than a's state: a stays where it is
    a = req(A)
    run_to_end(s, kv, a)
    run_to_end(s, kv, req(B))
    assert kv.held(a.seq_id) == 1502
    check_in_sync(s, kv)


def test_ram_stays_under_its_budget_least_recently_used_first() -> None:
    one = len(json.dumps(list(range(1502))))  # FakeKv's state of one conversation
    s, kv = make(parked=int(2.5 * one))
    convs = [list(range(10_000 * i, 10_000 * i + 1500)) for i in range(1, 6)]
    for conv in convs:
        run_to_end(s, kv, req(conv))
    parked = s.cache.parked
    assert parked is not None and parked.bytes <= parked.max_bytes
    assert 1 <= len(parked) <= 2
    kept = {e.tokens[0] for e in parked.entries()}
    assert kept <= {convs[-2][0], convs[-3][0]}  # the oldest went first
    check_in_sync(s, kv)


def test_parking_a_conversation_again_replaces_its_shorter_entry() -> None:
    s, kv = make()
    a = req(A)
    run_to_end(s, kv, a)
    run_to_end(s, kv, req(B))  # parks a
    c = req([*A, 7, 7, 5, 5])  # a's next turn: back whole, entry taken
    run_to_end(s, kv, c)
    run_to_end(s, kv, req([*B[:100], 1]))  # parks c's longer sequence
    assert s.cache.parked is not None
    lengths = sorted(len(e.tokens) for e in s.cache.parked.entries() if e.tokens[0] == A[0])
    assert lengths == [1506]  # c's sequence alone: a's entry went back to the pool whole
    check_in_sync(s, kv)
    parked = s.cache.parked
    parked.put(A[:100], (), bytearray(b"x" * 10), {})
    parked.put(A[:100], (("lora.gguf", 1.0),), bytearray(b"x" * 10), {})  # other adapters
    parked.put([*A, 7, 7, 5, 5, 7, 7, 9], (), bytearray(b"x" * 20), {})  # extends both
    kept = sorted((len(e.tokens), e.adapters) for e in parked.entries()
                  if e.tokens[0] == A[0])
    assert kept == [(100, (("lora.gguf", 1.0),)), (1507, ())]


@pytest.mark.parametrize("kind", ["recurrent", "swa"])
def test_memory_that_cannot_be_cut_comes_back_through_its_snapshot(kind: str) -> None:
    """A recurrent state (Qwen3.5) or a sliding window (Gemma 3) parked whole is cut back
    for a shorter shared prefix only through a snapshot stored with it; the restored
    sequence then decodes on the right state."""
    kv = FakeKv(recurrent=True) if kind == "recurrent" else FakeKv(n_swa_window=64)
    s, kv = make(kv=kv, n_swa=64 if kind == "swa" else 0, snapshots=1 << 20)
    system = [*range(100, 400), 2]  # a system message ending in an end-of-message token
    run_to_end(s, kv, req([*system, *range(600, 900)]))
    run_to_end(s, kv, req(B))  # parks the first conversation with its snapshots
    c = req([*system, *range(1000, 1100)])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens == len(system)
    while len(c.output) < 3:
        step(s, kv)
    assert not kv.wrong
    check_in_sync(s, kv)


def test_parked_sequences_go_to_disk_at_shutdown(tmp_path: Path) -> None:
    """A parked sequence the disk does not hold yet is saved with the cached ones, so the
    next start is warm for it too; one the disk already holds is not written again."""
    disk = DiskCache(DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 30, min_tokens=64),
                     "key")
    s, kv = make(disk=disk)
    run_to_end(s, kv, req(A))
    run_to_end(s, kv, req(B))  # a parked; its prompt was saved at the end of its prefill
    assert disk.flush()
    before = len(disk)
    c = list(range(20_000, 20_500))
    assert s.cache.parked is not None
    s.cache.parked.put(c, (), bytearray(b"[" + ", ".join(map(str, range(500))).encode() + b"]"),
                       {})
    s.cache.save_all()
    assert disk.flush()
    assert [n for n, _ in disk.lookup([*c, 1])] == [500]
    assert len(disk) == before + 1
    disk.close()


def test_a_failed_load_into_the_matched_sequence_is_not_reused_as_if_it_held_it() -> None:
    """With one free sequence id, a parked sequence is loaded into the very sequence the
    memory match found; when llama.cpp then rejects the state, the request must not be
    told that the cleared sequence still holds its prefix."""
    s, kv = make(n_seq=2)
    run_to_end(s, kv, req(A))
    busy = req(B)
    s.add(busy)
    step(s, kv)  # a parked
    run_to_end(s, kv, req([*A[:20], *range(9000, 9100)]))  # the only free id holds A[:20]
    kv.state_set = lambda seq, data: False  # type: ignore[method-assign]
    c = req([*A[:1000], 1, 2, 3])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens in (0, 20)
    check_in_sync(s, kv)


def test_a_parked_sliding_window_sequence_cut_back_keeps_none_of_its_later_snapshots() -> None:
    """A parked sequence loaded and cut where a new prompt diverges: the snapshots it was
    parked with past the cut were taken on the other conversation's tokens, and must not
    serve (or be parked again with) the new one."""
    kv = FakeKv(n_swa_window=512)
    s, kv = make(kv=kv, n_swa=512, snapshots=1 << 20)
    a = [*range(100, 219), 2, *range(300, 480)]  # a message ends at 120: a snapshot there
    run_to_end(s, kv, req(a))
    run_to_end(s, kv, req(B))  # parks a with its snapshots
    c = req([*a[:100], *range(6000, 6700)])
    run_to_end(s, kv, c)
    end = len(c.prompt) - 1  # c's own snapshot: one token before its prompt's end
    assert not [p for p in s.cache.snaps.positions(c.seq_id) if 100 < p < end]
    d = req([*c.prompt[:130], 7, 7, 7])
    s.add(d)
    while len(d.output) < 3:
        step(s, kv)
    assert not kv.wrong
    check_in_sync(s, kv)


def test_idle_sequences_are_parked_before_any_is_evicted_for_room() -> None:
    s, kv = make()
    s.cache.capacity = 3000
    a = req(A)
    run_to_end(s, kv, a)
    b = req(list(range(20_000, 22_000)))
    s.add(b)
    step(s, kv)
    assert s.cache.parked is not None and len(s.cache.parked) == 1  # a parked, not dropped
    check_in_sync(s, kv)


def test_a_sequence_too_large_to_park_is_not_copied_again_at_every_admission() -> None:
    s, kv = make(parked=100)
    copies = []
    real = kv.state_get

    def state_get(seq: int) -> bytearray:
        copies.append(seq)
        return real(seq)

    kv.state_get = state_get  # type: ignore[method-assign]
    kv.state_size = lambda seq: 10_000  # type: ignore[method-assign]
    a = req(A)
    run_to_end(s, kv, a)
    for i in range(3):
        run_to_end(s, kv, req([*range(30_000 + 1000 * i, 30_500 + 1000 * i)]))
    assert copies == [] and kv.held(a.seq_id) == 1502
    check_in_sync(s, kv)


def test_parking_others_never_pushes_out_the_entry_the_prompt_is_about_to_load() -> None:
    """RAM nearly full: parking the sequence that just finished must not drop the parked
    conversation the new prompt resumes (least recently used, but wanted now)."""
    s, kv = make(parked=9000)
    run_to_end(s, kv, req(A))
    run_to_end(s, kv, req(B))  # parks a (~7.4 kB of the 9 kB)
    c = req([*A, 7, 7, 9, 9, 9])
    s.add(c)
    step(s, kv)  # parks b, which does not fit beside a
    assert c.cached_tokens == 1502
    check_in_sync(s, kv)


def test_a_sequence_that_could_not_be_parked_is_tried_again_once_its_content_changed() -> None:
    # room for a 1,000-token state beside b's, not for a 1,502-token one
    budget = len(json.dumps(list(range(1000)))) + len(json.dumps(list(range(302)))) + 200
    assert budget < len(json.dumps(list(range(1502))))
    s, kv = make(n_seq=2, parked=budget)
    a = req(A)
    run_to_end(s, kv, a)
    b = req(B)
    s.add(b)
    step(s, kv)  # a is too large to park: it stays
    assert kv.held(a.seq_id) == 1502 and s.cache.slots[a.seq_id].stays
    # a prompt that cuts a back in place, then finds no room: a now holds 1,000 tokens
    assert not s.cache.admit(req([*A[:1000], 1, 2, 3]), reserved=100_000)
    assert kv.held(a.seq_id) == 1000
    s.remove(b)
    run_to_end(s, kv, req(list(range(40_000, 40_300))))
    assert s.cache.parked is not None and any(
        len(e.tokens) == 1000 for e in s.cache.parked.entries())
    check_in_sync(s, kv)
