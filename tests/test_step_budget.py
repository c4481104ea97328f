"""The measured prefill budget with no model: a fake cost model times each planned step,
the budget learns from the timings, and the scheduler sizes prefill chunks from it."""

from __future__ import annotations

import random

from test_scheduler import req, run_step

from engine.caches.prefix_cache import PrefixCache
from engine.scheduler import Scheduler, StepPlan
from engine.step_budget import StepBudget
from fake_kv import FakeKv


def fake_cost(decode: int, prefill: int) -> float:
    """CPU-like seconds per step: weights read once, then per-token compute."""
    return 0.040 + 0.008 * decode + (0.002 + 0.010 * prefill if prefill else 0.0)


def split(plan: StepPlan) -> tuple[int, int]:
    prefill = sum(len(i.tokens) for i in plan.items if i.pos < len(i.request.prompt))
    return plan.num_tokens - prefill, prefill


def test_nothing_measured_gives_the_initial_chunk_and_nobody_generating_the_cap() -> None:
    b = StepBudget(cap=512, initial=32)
    assert b.prefill_tokens(8) == 32
    assert b.prefill_tokens(0) == 512
    assert StepBudget(cap=16, initial=32).prefill_tokens(8) == 16  # prefill_chunk caps it


def test_budget_fits_the_target_from_measured_steps() -> None:
    b = StepBudget(cap=512, target=2.0)
    for _ in range(5):
        b.observe(8, 0, fake_cost(8, 0))
    assert abs((b.decode_seconds(8) or 0) - 0.104) < 1e-9
    for _ in range(10):
        b.observe(8, 10, fake_cost(8, 10))
    assert abs((b.prefill_cost() or 0) - 0.0102) < 1e-9  # 10.2 ms: the fixed 2 ms spread
    sizes = [b.prefill_tokens(8) for _ in range(6)]
    assert sizes == [4, 9, 10, 10, 10, 10]  # grows from nothing by at most 1.25x + 4
    n = sizes[-1]
    assert fake_cost(8, n) <= 2 * fake_cost(8, 0) < fake_cost(8, n + 1)
    assert b.prefill_tokens(0) == 512  # nobody generating: the cap
    assert b.prefill_tokens(16) == n  # an unmeasured size: the nearest measured one
    b.target = 4.0
    assert [b.prefill_tokens(8) for _ in range(6)][-1] == 30


def test_decode_sizes_interpolate_and_a_prompt_always_advances() -> None:
    b = StepBudget(cap=512)
    b.observe(4, 0, 0.1)
    b.observe(8, 0, 0.2)
    assert abs((b.decode_seconds(6) or 0) - 0.15) < 1e-9
    assert b.decode_seconds(2) == 0.1 and b.decode_seconds(20) == 0.2
    b.observe(8, 10, 0.2 + 10.0)  # a prompt token costs a second
    assert b.prefill_tokens(8) == 4  # min_tokens


def test_free_prefill_grows_to_the_cap() -> None:
    b = StepBudget(cap=256)
    b.observe(8, 0, 0.1)
    b.observe(8, 16, 0.09)  # no measurable cost (noise)
    sizes = [b.prefill_tokens(8) for _ in range(30)]
    assert sizes[0] == 4 and sizes == sorted(sizes) and sizes[-1] == 256


def test_scheduler_keeps_streams_within_the_target_while_a_long_prompt_prefills() -> None:
    """Streams generate while a long prompt arrives; each step is timed by the fake cost
    model (with noise) and fed back. After a few steps every step stays within about
    twice the decode-only step, and the prompt still gets prefilled."""
    rng = random.Random(0)
    budget = StepBudget(cap=512, target=2.0)
    s = Scheduler(PrefixCache(10, FakeKv(), capacity=100_000), 512, step_budget=budget)
    streams = [req(8, max_new=10_000) for _ in range(8)]
    for r in streams:
        s.add(r)

    def step() -> tuple[int, int, float]:
        plan = s.schedule()
        decode, prefill = split(plan)
        seconds = fake_cost(decode, prefill) * rng.uniform(0.97, 1.03)
        budget.observe(decode, prefill, seconds)
        run_step(s, plan)
        return decode, prefill, seconds

    assert step()[:2] == (0, 64)  # nothing generating: every prompt in one step
    for _ in range(10):
        assert step()[:2] == (8, 0)
    long = req(4000, max_new=1)
    s.add(long)
    sizes, times = [], []
    while not long.output:
        decode, prefill, seconds = step()
        assert decode == 8
        sizes.append(prefill)
        times.append(seconds)
    assert sizes[0] == 32  # the initial chunk, before a mixed step is measured
    assert sum(sizes) == 4000
    assert max(times[1:]) <= 2 * fake_cost(8, 0) * 1.05
    assert min(sizes[10:-1]) >= 8 and max(sizes[1:-1]) <= 11


def test_an_explicit_prefill_chunk_caps_the_measured_budget() -> None:
    budget = StepBudget(cap=4, decode={1: 1.0}, sizes=[1], sxx=100, sxy=0.1, last=100)
    assert budget.prefill_tokens(1) == 4
    s = Scheduler(PrefixCache(4, FakeKv(), capacity=100_000), 512, prefill_chunk=4,
                  step_budget=budget)
    first = req(10)
    s.add(first)
    run_step(s, s.schedule())
    s.add(req(300))
    assert [len(i.tokens) for i in s.schedule().items] == [1, 4]
