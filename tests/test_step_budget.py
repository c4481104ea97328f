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
    for p in (32, 10, 20, 8, 12, 9, 10):
        b.observe(8, p, fake_cost(8, p))
    fixed, per_token = b.prefill_cost() or (0.0, 0.0)
    assert abs(fixed - 0.002) < 1e-6 and abs(per_token - 0.010) < 1e-6
    n = b.prefill_tokens(8)
    assert n == int((0.104 - 0.002) / 0.010)  # 10 tokens: the step stays within 2x
    assert fake_cost(8, n) <= 2 * fake_cost(8, 0) < fake_cost(8, n + 1)
    assert b.prefill_tokens(0) == 512
    assert b.prefill_tokens(16) == n  # an unmeasured size: the nearest measured one
    assert StepBudget(cap=512, target=4.0, decode=b.decode, sizes=b.sizes, w=b.w, sx=b.sx,
                      sy=b.sy, sxx=b.sxx, sxy=b.sxy).prefill_tokens(8) == 30


def test_decode_sizes_interpolate_and_alike_prefill_sizes_use_the_average() -> None:
    b = StepBudget(cap=512)
    b.observe(4, 0, 0.1)
    b.observe(8, 0, 0.2)
    assert abs((b.decode_seconds(6) or 0) - 0.15) < 1e-9
    assert b.decode_seconds(2) == 0.1 and b.decode_seconds(20) == 0.2
    for _ in range(6):
        b.observe(8, 10, 0.2 + 0.12)  # always 10 tokens: no line, 12 ms a token on average
    assert b.prefill_cost() == (0.0, b.sxy / b.sxx)
    assert b.prefill_tokens(8) == 16  # 0.2 / 0.012
    assert StepBudget(cap=512, min_tokens=4, decode={8: 0.001}, sizes=[8], w=1, sx=10,
                      sy=1, sxx=100, sxy=10).prefill_tokens(8) == 4  # a prompt still advances


def test_free_prefill_is_tried_at_the_cap() -> None:
    b = StepBudget(cap=256)
    b.observe(8, 0, 0.1)
    b.observe(8, 16, 0.09)  # no measurable cost (noise)
    assert b.prefill_tokens(8) == 256


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
    assert max(times[3:]) <= 2 * fake_cost(8, 0) * 1.1
    assert min(sizes[3:-1]) >= 8 and max(sizes[3:-1]) <= 12


def test_an_explicit_prefill_chunk_caps_the_measured_budget() -> None:
    budget = StepBudget(cap=4, decode={1: 1.0}, sizes=[1], w=1, sx=10, sy=0.1, sxx=100,
                        sxy=1.0)
    assert budget.prefill_tokens(1) == 4
    s = Scheduler(PrefixCache(4, FakeKv(), capacity=100_000), 512, prefill_chunk=4,
                  step_budget=budget)
    first = req(10)
    s.add(first)
    run_step(s, s.schedule())
    s.add(req(300))
    assert [len(i.tokens) for i in s.schedule().items] == [1, 4]
