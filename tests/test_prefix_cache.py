"""Prefix reuse decisions with no model: in place, by copy, waiting, LRU, SWA, disk."""

from __future__ import annotations

from pathlib import Path

from engine.caches.disk_cache import DiskCache
from engine.caches.prefix_cache import PrefixCache
from engine.config import DiskCacheConfig
from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler, StepPlan
from fake_kv import FakeKv


def make(n_seq: int = 4, capacity: int = 10_000, n_batch: int = 4096, kv: FakeKv | None = None,
         n_swa: int = 0, disk: DiskCache | None = None) -> tuple[Scheduler, FakeKv]:
    kv = kv or FakeKv()
    cache = PrefixCache(n_seq, kv, capacity=capacity, n_swa=n_swa, disk=disk)
    return Scheduler(cache, n_batch), kv


def req(prompt: list[int], **params: object) -> Request:
    return Request(prompt=list(prompt), params=SamplingParams(**params),  # type: ignore[arg-type]
                   max_new_tokens=8)


def step(s: Scheduler, kv: FakeKv, sampled: int = 7) -> StepPlan:
    plan = s.schedule()
    for item in plan.items:
        kv.decode(item.request.seq_id, len(item.tokens))
    s.commit(plan)
    for item in plan.items:
        r = item.request
        if r.num_computed == len(r.prompt) and item.pos < len(r.prompt):
            s.cache.prefill_done(r)
        if item.logits:
            r.output.append(sampled)
    return plan


def run_to_end(s: Scheduler, kv: FakeKv, r: Request, new_tokens: int = 3) -> None:
    s.add(r)
    while len(r.output) < new_tokens:
        step(s, kv)
    s.remove(r)


def check_in_sync(s: Scheduler, kv: FakeKv) -> None:
    """What the cache believes each sequence holds is what the KV holds."""
    for slot in s.cache.slots:
        assert kv.held(slot.seq_id) == len(slot.tokens), slot


P = list(range(100, 1600))  # a 1,500-token prompt


def test_follow_up_reuses_a_free_slot_in_place() -> None:
    s, kv = make()
    a = req(P)
    run_to_end(s, kv, a)
    assert len(s.cache.slots[a.seq_id].tokens) == 1500 + 2  # prompt + fed-back tokens
    b = req([*P, 7, 7, 5, 5])  # the next turn: prompt, answer, new text
    s.add(b)
    step(s, kv)
    assert b.seq_id == a.seq_id and b.cached_tokens == 1502
    check_in_sync(s, kv)


def test_partial_prefix_ending_mid_run_is_reused() -> None:
    s, kv = make()
    run_to_end(s, kv, req(P))
    b = req([*P[:1000], 1, 2, 3])
    s.add(b)
    plan = step(s, kv)
    assert b.cached_tokens == 1000
    assert plan.items[0].pos == 1000 and plan.items[0].tokens == [1, 2, 3]
    check_in_sync(s, kv)


def test_identical_prompt_still_evaluates_its_last_token() -> None:
    s, kv = make()
    run_to_end(s, kv, req(P))
    b = req(P)
    s.add(b)
    plan = step(s, kv)
    assert b.cached_tokens == 1499 and plan.items[0].tokens == [P[-1]]
    assert plan.items[0].logits


def test_prefix_is_copied_from_a_busy_sequence() -> None:
    s, kv = make()
    a = req(P)
    s.add(a)
    step(s, kv)  # a is generating now
    b = req([*P[:800], 5])
    s.add(b)
    step(s, kv)
    assert b.seq_id != a.seq_id and b.cached_tokens == 800
    assert ("copy", a.seq_id, b.seq_id, 800) in kv.ops
    assert s.cache.cells_used() == 1501 + 1  # shared cells count once
    check_in_sync(s, kv)


def test_waits_for_a_busy_prefill_of_the_shared_prefix() -> None:
    s, kv = make(n_batch=512)
    a, b = req(P), req([*P[:1200], 9, 9])
    s.add(a)
    s.add(b)
    plans = []
    while not b.output:
        plans.append([(i.request is b, len(i.tokens)) for i in step(s, kv).items])
    assert b.cached_tokens == 1200
    assert all(not any(is_b for is_b, _ in p) for p in plans[:3])  # b waited for a's prefill
    assert (True, 2) in plans[-1]


def test_least_recently_used_cache_is_evicted_first() -> None:
    s, kv = make(n_seq=3, capacity=700)
    x, y = req(list(range(300))), req(list(range(1000, 1300)))
    run_to_end(s, kv, x)
    run_to_end(s, kv, y)
    z = req(list(range(5000, 5300)))  # needs 301 cells: only x's can go (older)
    s.add(z)
    step(s, kv)
    assert z.cached_tokens == 0
    assert not s.cache.slots[x.seq_id].tokens and s.cache.slots[y.seq_id].tokens
    check_in_sync(s, kv)
    s.remove(z)
    again = req([*list(range(1000, 1300)), 1])
    s.add(again)
    step(s, kv)
    assert again.cached_tokens == 300


def test_sliding_window_reuse_needs_the_window_before_the_cut() -> None:
    s, kv = make(kv=FakeKv(n_swa_window=100), n_swa=100)
    run_to_end(s, kv, req(P))  # the SWA cache keeps only the last 100 positions
    mid = req([*P[:700], 1])
    s.add(mid)
    step(s, kv)
    assert mid.cached_tokens == 0  # the window before position 700 is gone
    s.remove(mid)
    s2, kv2 = make(kv=FakeKv(n_swa_window=100), n_swa=100)
    run_to_end(s2, kv2, req(P))
    tail = req([*P, 7, 7, 4])
    s2.add(tail)
    step(s2, kv2)
    assert tail.cached_tokens == 1502  # continuing at the end only needs the last window


def test_memory_that_cannot_be_cut_falls_back_to_a_full_prefill() -> None:
    s, kv = make(kv=FakeKv(trim_fails=True))
    run_to_end(s, kv, req(P))
    b = req([*P[:900], 1])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    check_in_sync(s, kv)


def test_prompt_logprobs_requests_evaluate_every_token() -> None:
    s, kv = make()
    run_to_end(s, kv, req(P))
    b = req([*P, 1], prompt_logprobs=True)
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0


def test_disk_entry_is_loaded_after_a_restart(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 20, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv = make(disk=disk)
    run_to_end(s, kv, req(P))
    b = req([*P[:1000], 3, 3])  # diverges: the shared 1,000 tokens are saved too
    run_to_end(s, kv, b)
    assert disk.flush()
    disk.close()
    assert sorted(len(disk._tree.tokens(k)) for k in disk._entries) == [1000, 1500]

    restarted = DiskCache(cfg, key="k")
    s2, kv2 = make(disk=restarted)
    c = req([*P[:1000], 4, 4])
    s2.add(c)
    step(s2, kv2)
    assert c.cached_tokens == 1000 and kv2.held(c.seq_id) == 1002
    d = req(P)  # the whole stored prompt: load it and evaluate its last token again
    s2.add(d)
    step(s2, kv2)
    assert d.cached_tokens == 1499
    restarted.close()


def test_corrupt_state_rejected_by_llama_cpp_is_deleted(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 20, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    disk.put(P[:500], bytearray(b"not a state"))
    assert disk.flush()
    s, kv = make(disk=disk)
    c = req(P[:600])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens == 0 and len(disk) == 0
    assert disk.metrics.disk_rejected.labels("corrupt")._value.get() == 1
    disk.close()


def test_a_stored_prompt_that_diverges_still_serves_its_shared_prefix(tmp_path: Path) -> None:
    """Another replica (or an earlier run) saved a whole prompt; a new prompt shares its
    first 1,200 tokens and then asks something else: the entry is loaded and cut there."""
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 20, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv = make(disk=disk)
    run_to_end(s, kv, req(P))  # saves all 1,500 tokens
    assert disk.flush()
    other = DiskCache(cfg, key="k")
    s2, kv2 = make(disk=other)
    c = req([*P[:1200], 9, 9, 9])
    s2.add(c)
    step(s2, kv2)
    assert c.cached_tokens == 1200 and kv2.held(c.seq_id) == 1203
    assert other.metrics.disk_hits._value.get() == 1
    third = DiskCache(cfg, key="k")
    s3, kv3 = make(disk=third)
    e = req([*P[:200], *range(50_000, 51_300)])  # shares too little of the entry: not loaded
    s3.add(e)
    step(s3, kv3)
    assert e.cached_tokens == 0 and third.metrics.disk_hits._value.get() == 0
    third.close()
    disk.close()
    other.close()


def test_short_cached_sequences_are_reclaimed_before_empty_ones() -> None:
    s, kv = make(n_seq=4)
    short = req(list(range(5000, 5100)))
    run_to_end(s, kv, short)
    other = req(list(range(7000, 7100)))  # unrelated: reuses the short slot, not an empty one
    s.add(other)
    step(s, kv)
    assert other.seq_id == short.seq_id
    assert sum(1 for slot in s.cache.slots if slot.tokens) == 1


def test_a_finished_answer_is_saved_so_the_next_turn_reloads_it(tmp_path: Path) -> None:
    """Agents resend the conversation with the model's answer appended: the sequence is
    saved again when its request ends, so a next turn evicted from memory reloads the
    answer from disk instead of evaluating it again. A short answer is not worth a save."""
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv = make(disk=disk)
    first = req(P[:1000])
    run_to_end(s, kv, first, new_tokens=40)  # 39 of them are in the KV
    short = req(P[1000:1300])
    run_to_end(s, kv, short, new_tokens=5)  # 4 in the KV: below ANSWER_MIN_SAVE
    assert disk.flush()
    assert sorted(len(disk._tree.tokens(k)) for k in disk._entries) == [300, 1000, 1039]

    restarted = DiskCache(cfg, key="k")  # memory is gone
    s2, kv2 = make(disk=restarted)
    nxt = req([*P[:1000], *first.output[:39], 5, 5, 5])
    s2.add(nxt)
    step(s2, kv2)
    assert nxt.cached_tokens == 1039 and kv2.held(nxt.seq_id) == 1042
    disk.close()
    restarted.close()
