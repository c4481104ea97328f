"""Scheduler decisions with no model: FIFO admission, chunked prefill, KV pressure."""

from __future__ import annotations

import itertools

from engine.caches.prefix_cache import PrefixCache
from engine.request import Request, SamplingParams, Status
from engine.scheduler import Scheduler, StepPlan
from fake_kv import FakeKv

_offsets = itertools.count(1000, 1000)


def Sched(n_seq_max: int, n_batch: int, kv_capacity: int) -> Scheduler:
    return Scheduler(PrefixCache(n_seq_max, FakeKv(), capacity=kv_capacity), n_batch)


def req(prompt_len: int, max_new: int = 8) -> Request:
    """A request whose prompt shares nothing with any other request's."""
    start = next(_offsets)
    return Request(prompt=list(range(start, start + prompt_len)), params=SamplingParams(),
                   max_new_tokens=max_new)


def run_step(s: Scheduler, plan: StepPlan, sampled: int = 7) -> None:
    """What the engine does after a successful decode: commit, then sample."""
    kv = s.cache.kv
    assert isinstance(kv, FakeKv)
    for item in plan.items:
        kv.decode(item.request.seq_id, len(item.tokens))
    s.commit(plan)
    for item in plan.items:
        if item.logits:
            item.request.output.append(sampled)


def test_fifo_admission_limited_by_sequence_ids() -> None:
    s = Sched(n_seq_max=2, n_batch=512, kv_capacity=4096)
    a, b, c = req(4), req(4), req(4)
    for r in (a, b, c):
        s.add(r)
    plan = s.schedule()
    assert [i.request for i in plan.items] == [a, b]
    assert {a.seq_id, b.seq_id} == {0, 1}
    assert c.status is Status.WAITING and list(s.waiting) == [c]


def test_chunked_prefill_respects_the_batch_budget() -> None:
    s = Sched(n_seq_max=4, n_batch=16, kv_capacity=4096)
    long = req(40)
    s.add(long)
    sizes = []
    while not long.prefill_done:
        plan = s.schedule()
        assert plan.num_tokens <= 16
        sizes.append([(len(i.tokens), i.pos, i.logits) for i in plan.items])
        run_step(s, plan)
    assert sizes == [[(16, 0, False)], [(16, 16, False)], [(8, 32, True)]]
    assert long.output == [7]


def test_decode_tokens_come_first_and_prefill_gets_the_rest() -> None:
    s = Sched(n_seq_max=4, n_batch=10, kv_capacity=4096)
    a = req(3)
    s.add(a)
    run_step(s, s.schedule())  # a prefilled, one token sampled
    b = req(30)
    s.add(b)
    plan = s.schedule()
    assert plan.items[0].request is a and plan.items[0].tokens == [7]
    assert plan.items[0].pos == 3 and plan.items[0].logits
    assert plan.items[1].request is b and len(plan.items[1].tokens) == 9
    assert plan.num_tokens == 10


def test_waiting_request_is_not_admitted_until_kv_cells_are_free() -> None:
    s = Sched(n_seq_max=4, n_batch=512, kv_capacity=100)
    a, b = req(60), req(50)
    s.add(a)
    s.add(b)
    plan = s.schedule()
    assert [i.request for i in plan.items] == [a]
    run_step(s, plan)
    s.remove(a)
    plan = s.schedule()
    assert [i.request for i in plan.items] == [b]


def test_youngest_generating_sequence_is_preempted_when_kv_is_full() -> None:
    s = Sched(n_seq_max=4, n_batch=512, kv_capacity=21)
    a, b = req(10), req(9)
    s.add(a)
    s.add(b)
    run_step(s, s.schedule())  # 19 cells used, both generating
    plan = s.schedule()  # needs 2 more cells, only 2 free: fine
    assert not plan.preempted
    run_step(s, plan)  # 21 used
    plan = s.schedule()
    assert plan.preempted == [b] and b.finish_reason == "length"
    assert [i.request for i in plan.items] == [a]
    assert b.status is Status.FINISHED


def test_removed_request_frees_its_sequence_for_the_next_waiting() -> None:
    s = Sched(n_seq_max=1, n_batch=64, kv_capacity=4096)
    a, b = req(4), req(4)
    s.add(a)
    s.add(b)
    s.schedule()
    seq = a.seq_id
    s.remove(a)  # cancelled
    plan = s.schedule()
    assert [i.request for i in plan.items] == [b] and b.seq_id == seq


def test_cancelling_a_waiting_request() -> None:
    s = Sched(n_seq_max=1, n_batch=64, kv_capacity=4096)
    a, b = req(4), req(4)
    s.add(a)
    s.add(b)
    s.remove(b)
    assert list(s.waiting) == [a] and b.status is Status.FINISHED
    assert [i.request for i in s.schedule().items] == [a]
    assert not s.waiting


def test_prefill_chunk_bounds_prompt_tokens_only_while_others_generate() -> None:
    s = Scheduler(PrefixCache(4, FakeKv(), capacity=100_000), 512, prefill_chunk=64)
    first = req(300)
    s.add(first)
    plan = s.schedule()
    assert [len(i.tokens) for i in plan.items] == [300]  # nobody generates: the whole budget
    run_step(s, plan)
    second = req(300)
    s.add(second)
    plan = s.schedule()
    assert [(i.request is first, len(i.tokens)) for i in plan.items] == [(True, 1), (False, 64)]


def test_interactive_requests_are_admitted_before_waiting_batch_lines() -> None:
    """Request.priority: a waiting interactive request (0) goes ahead of every waiting
    batch line (BACKGROUND); FIFO within each priority."""
    from engine.request import BACKGROUND
    s = Sched(n_seq_max=1, n_batch=512, kv_capacity=4096)
    first, b1, b2 = req(4), req(4), req(4)
    b1.priority = b2.priority = BACKGROUND
    for r in (first, b1, b2):
        s.add(r)
    i1, i2 = req(4), req(4)
    s.add(i1)
    s.add(i2)
    assert list(s.waiting) == [first, i1, i2, b1, b2]
    plan = s.schedule()
    assert [i.request for i in plan.items] == [first]
    s.remove(first)
    assert [i.request for i in s.schedule().items] == [i1]


def test_a_waiting_interactive_request_takes_a_batch_lines_sequence() -> None:
    """Request.suspend: with every sequence held by batch lines, a waiting interactive
    request gets the sequence of the line with the least computed at once; the line waits
    first among the background ones, its output joined to its prompt, and comes back
    where it was: one prefill of prompt + output (the user took its sequence) whose last
    logits give its next token, its usage counted as before."""
    from engine.request import BACKGROUND
    s = Sched(n_seq_max=2, n_batch=512, kv_capacity=4096)
    b1, b2, b3 = req(7, max_new=50), req(6, max_new=50), req(6, max_new=50)
    for b in (b1, b2, b3):
        b.priority = BACKGROUND
        s.add(b)
    run_step(s, s.schedule())  # b1, b2 prefill and sample their first token
    for _ in range(3):
        run_step(s, s.schedule())
    assert len(b2.output) == 4 and b2.num_computed == 6 + 3
    prompt, output = list(b2.prompt), list(b2.output)
    user = req(5)
    s.add(user)
    plan = s.schedule()
    assert plan.suspended == [b2] and b2.status is Status.WAITING
    assert list(s.waiting) == [b2, b3]
    assert [i.request for i in plan.items] == [b1, user]  # the user prefills this step
    assert b2.prompt == prompt + output and b2.output == output and b2.n_prompt == 6
    assert b2.num_tokens == 6 + 4
    run_step(s, plan)
    s.remove(user)
    plan = s.schedule()
    resumed = next(i for i in plan.items if i.request is b2)
    assert resumed.tokens == prompt + output and resumed.pos == 0 and resumed.logits
    assert b2.cached_tokens == 0  # its own work, not the cache's
    run_step(s, plan, sampled=8)
    assert b2.output == [*output, 8] and b2.num_computed == 10
    assert s.schedule().items[-1].tokens == [8]  # and it decodes on as before


def test_nothing_is_suspended_while_a_sequence_is_free_or_for_another_batch_line() -> None:
    from engine.request import BACKGROUND
    s = Sched(n_seq_max=2, n_batch=512, kv_capacity=4096)
    b1 = req(6)
    b1.priority = BACKGROUND
    s.add(b1)
    run_step(s, s.schedule())
    user = req(4)
    s.add(user)
    assert s.schedule().suspended == []  # a sequence was free
    b2, b3 = req(4), req(4)
    b2.priority = b3.priority = BACKGROUND
    s.remove(user)
    s.add(b2)
    run_step(s, s.schedule())
    s.add(b3)
    assert s.schedule().suspended == []  # batch lines wait for each other


def test_prefill_is_not_chunked_for_the_sake_of_batch_lines() -> None:
    """The prefill chunk keeps running streams' steps short; batch lines have no reader
    waiting, so beside them an interactive prompt prefills with the whole batch."""
    from engine.request import BACKGROUND
    s = Scheduler(PrefixCache(4, FakeKv(), capacity=4096), n_batch=256, prefill_chunk=16)
    line = req(4)
    line.priority = BACKGROUND
    s.add(line)
    run_step(s, s.schedule())
    user = req(100)
    s.add(user)
    plan = s.schedule()
    assert [len(i.tokens) for i in plan.items] == [1, 100]
    s.remove(line)
    run_step(s, plan)
    other = req(100)
    s.add(other)  # beside an interactive stream the chunk applies
    assert [len(i.tokens) for i in s.schedule().items] == [1, 16]


def test_a_decode_only_step_is_planned_as_the_general_path_plans_it() -> None:
    """The one-pass plan of a step where every sequence only generates equals the general
    path's (items, positions, adapter set), and it steps aside for a waiting request, a
    draft, or a KV cache with no cell left."""
    def state() -> tuple[Scheduler, list[Request]]:
        s = Sched(n_seq_max=4, n_batch=64, kv_capacity=4096)
        rs = [req(5), req(9), req(3)]
        for r in rs:
            s.add(r)
        run_step(s, s.schedule())  # prompts in, a token each
        return s, rs

    def shape(plan: StepPlan) -> list[tuple[int, list[int], int, bool, int]]:
        return [(i.request.id, i.tokens, i.pos, i.logits, i.n_draft) for i in plan.items]

    fast, _ = state()
    general, _ = state()
    general._decode_only = lambda: None  # type: ignore[method-assign]
    for _ in range(3):
        a, b = fast.schedule(), general.schedule()
        assert [x[1:] for x in shape(a)] == [x[1:] for x in shape(b)]
        assert a.adapters == b.adapters and not a.preempted and not a.suspended
        run_step(fast, a)
        run_step(general, b)
    s, rs = state()
    assert s._decode_only() is not None
    s.add(req(4))
    assert len(s.schedule().items) == 4  # waiting: the general path, which admits it too
    s, rs = state()
    rs[0].draft = [1, 2]
    assert s._decode_only() is None
    s, rs = state()
    s.kv_capacity = s.cache.cells_used() + 2  # no cell for the third
    assert s._decode_only() is None
