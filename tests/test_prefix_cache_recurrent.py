"""The prefix cache on recurrent / hybrid memory (one state per sequence, at its last
position), against the fake KV's recurrent mode: a sequence is reused only whole."""

from __future__ import annotations

from pathlib import Path

from test_prefix_cache import P, make, req, run_to_end, step

from engine.caches.disk_cache import DiskCache
from engine.config import DiskCacheConfig
from engine.scheduler import Scheduler
from fake_kv import FakeKv


def recurrent(rollback: int = 0, **kw: object) -> tuple[Scheduler, FakeKv]:
    return make(kv=FakeKv(recurrent=True, rollback=rollback), **kw)  # type: ignore[arg-type]


def check_in_sync(s: Scheduler, kv: FakeKv) -> None:
    """Every sequence holds what the cache believes, its state is at its end, and no
    decode ever ran on a state that had read other tokens."""
    assert not kv.wrong
    for slot in s.cache.slots:
        assert kv.held(slot.seq_id) == len(slot.tokens), slot
        if slot.tokens and not getattr(slot, "rolled_back", False):
            assert kv.state[slot.seq_id] == len(slot.tokens), slot


def partial_trims(kv: FakeKv) -> list[tuple[object, ...]]:
    return [op for op in kv.ops if op[0] == "trim" and op[2] != 0]


def test_a_shorter_prefix_of_a_cached_sequence_is_not_reused() -> None:
    s, kv = recurrent(rollback=4)
    run_to_end(s, kv, req(P))  # holds P + 2 fed-back tokens
    b = req([*P, 1])  # shares 1,500 of 1,502: its state has read two more
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0 and not partial_trims(kv)
    check_in_sync(s, kv)
    s.remove(b)
    c = req([*P[:1000], 1, 2, 3])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens == 0 and not partial_trims(kv)
    check_in_sync(s, kv)


def test_a_busy_sequence_is_copied_only_at_its_end() -> None:
    s, kv = recurrent()
    a = req(P)
    s.add(a)
    step(s, kv)  # a's prefill is done: it holds P, its first token is sampled
    c = req([*P, 9, 9])  # all of a so far (a busy sequence is indexed by its prompt)
    s.add(c)
    step(s, kv)  # c is admitted before a decodes again
    assert c.seq_id != a.seq_id and c.cached_tokens == len(P)
    assert ("copy", a.seq_id, c.seq_id, len(P)) in kv.ops
    check_in_sync(s, kv)
    b = req([*P[:800], 5])  # the system prompt only: the copy would carry a state at 1,501
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    assert [op for op in kv.ops if op[0] == "copy"] == [("copy", a.seq_id, c.seq_id, len(P))]
    check_in_sync(s, kv)


def test_a_whole_cached_sequence_is_reused_in_place() -> None:
    s, kv = recurrent()
    a = req(P)
    run_to_end(s, kv, a)
    b = req([*P, 7, 7, 5, 5])  # the next turn: prompt, answer, new text
    s.add(b)
    step(s, kv)
    assert b.seq_id == a.seq_id and b.cached_tokens == 1502 and not partial_trims(kv)
    check_in_sync(s, kv)


def test_an_identical_prompt_is_evaluated_from_scratch() -> None:
    s, kv = recurrent(rollback=4)
    run_to_end(s, kv, req(P[:1000]))
    b = req(P[:1000])  # one token would have to be cut back for logits
    s.add(b)
    plan = step(s, kv)
    assert b.cached_tokens == 0 and plan.items[0].logits and not partial_trims(kv)
    check_in_sync(s, kv)


def test_no_waiting_for_a_prefill_that_passes_the_shared_prefix() -> None:
    s, kv = recurrent(n_batch=512)
    a, b = req(P), req([*P[:1200], 9, 9])
    s.add(a)
    s.add(b)
    step(s, kv)
    assert b.seq_id is not None and b.cached_tokens == 0  # admitted at once
    while not b.output:
        step(s, kv)
    check_in_sync(s, kv)


def test_disk_entries_are_loaded_only_whole(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv = recurrent(disk=disk)
    run_to_end(s, kv, req(P[:1000]))  # saved: 1,000 (and 1,002 with the answer: too short)
    run_to_end(s, kv, req(P))  # saved: 1,500
    assert disk.flush()
    disk.close()
    assert sorted(len(disk._tree.tokens(k)) for k in disk._entries) == [1000, 1500]

    for prompt, whole in (([*P[:1200], 9], 1000), (P, 1000), ([*P, 7], 1500)):
        restarted = DiskCache(cfg, key="k")
        s2, kv2 = recurrent(rollback=4, disk=restarted)
        r = req(prompt)
        s2.add(r)
        step(s2, kv2)
        assert r.cached_tokens == whole, prompt[-3:]
        assert not partial_trims(kv2)
        check_in_sync(s2, kv2)
        restarted.close()


def test_a_draft_rollback_is_not_copied_saved_or_kept(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv = recurrent(rollback=4, disk=disk)
    a = req(P)
    a.max_new_tokens = 64
    s.add(a)
    step(s, kv)  # prefill
    a.draft = [1, 2, 3]
    step(s, kv)  # the pending token and three drafted ones
    s.cache.trim(a, len(P) + 1)  # all three rejected: rolled back in a's next decode
    a.num_computed = len(P) + 1
    a.draft = []
    slot = s.cache.slots[a.seq_id]
    assert slot.rolled_back and len(slot.tokens) == len(P) + 1
    b = req([*slot.tokens, 4, 4])  # all of a: still refused until a decodes again
    s.add(b)
    step(s, kv)  # a decodes too: its rollback is applied
    assert b.cached_tokens == 0 and not slot.rolled_back
    check_in_sync(s, kv)
    s.remove(b)
    a.draft = [1, 2]
    step(s, kv)
    s.cache.trim(a, a.num_computed - 2)
    a.num_computed -= 2
    assert disk.flush()
    saved = len(disk)
    s.remove(a)  # ends right after a rollback: neither saved nor kept
    assert disk.flush() and len(disk) == saved
    assert not slot.tokens and kv.held(slot.seq_id) == 0
    check_in_sync(s, kv)
    disk.close()
