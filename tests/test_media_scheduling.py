"""Media and LoRA adapter sets in the scheduler and the prefix cache, with no model.

Media sit in a prompt as media tokens (engine.media.spans): a prefill chunk never mixes
text and media, a media without embeddings is not scheduled, a media evaluated whole is
never cut, and a cached prefix never ends inside a media. Adapter sets: steps take turns,
nobody starves, and the prefix cache never reuses KV across sets.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_prefix_cache import check_in_sync, step

from engine.caches.prefix_cache import PrefixCache
from engine.media.spans import (
    IDENTITY,
    MediaSpan,
    PositionMap,
    is_media_token,
    media_tokens,
    reusable,
    segment_end,
    span_at,
)
from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler
from fake_kv import FakeKv

TEXT_A = list(range(100, 400))  # 300 text tokens
TEXT_B = list(range(500, 520))


def media_prompt(key: str, n: int = 16, whole: bool = False, before: list[int] = TEXT_A,
                 after: list[int] = TEXT_B) -> tuple[list[int], tuple[MediaSpan, ...]]:
    span = MediaSpan(len(before), n, key, "image", whole)
    return [*before, *media_tokens(key, n), *after], (span,)


def req(prompt: list[int], media: tuple[MediaSpan, ...] = (),
        adapters: tuple[tuple[str, float], ...] = ()) -> Request:
    return Request(prompt=list(prompt), params=SamplingParams(), max_new_tokens=4,
                   media=tuple(s.fresh() for s in media), adapters=adapters)


def make(n_seq: int = 4, n_batch: int = 4096) -> tuple[Scheduler, FakeKv]:
    kv = FakeKv()
    return Scheduler(PrefixCache(n_seq, kv, capacity=100_000), n_batch), kv


def encode_pending(s: Scheduler) -> None:
    """What Engine._encode_media does, without a projector."""
    for r in s.running:
        span = r.pending_media
        if span is not None:
            span.embd = np.zeros((span.n_tokens, 4), dtype=np.float32)


# -- media tokens ------------------------------------------------------------------------


def test_media_tokens_are_negative_distinct_and_stable() -> None:
    a, b = media_tokens("aa", 64), media_tokens("bb", 64)
    assert all(is_media_token(t) for t in a + b)
    assert all(-(2**31) <= t < -1 for t in a + b)  # int32, like the disk cache stores them
    assert a == media_tokens("aa", 64)  # the same on every run: disk entries stay valid
    assert len(set(a)) == 64 and not set(a) & set(b)
    assert media_tokens("aa", 8) == a[:8]


def test_segments_and_reuse_boundaries() -> None:
    spans = (MediaSpan(10, 5, "x", "image"), MediaSpan(20, 3, "y", "image"))
    assert [segment_end(spans, p, 30) for p in (0, 9, 10, 12, 15, 19, 20, 23, 29)] == \
        [10, 10, 15, 15, 20, 20, 23, 30, 30]
    assert span_at(spans, 14) is spans[0] and span_at(spans, 15) is None
    # a cached prefix may end before or after a media, never inside one
    assert [reusable(spans, n) for n in (5, 10, 11, 14, 15, 21, 23)] == \
        [5, 10, 10, 10, 15, 20, 23]


# -- scheduling ---------------------------------------------------------------------------


def test_prefill_chunks_never_mix_text_and_media_and_wait_for_embeddings() -> None:
    s, kv = make()
    prompt, media = media_prompt("img")
    r = req(prompt, media)
    s.add(r)
    plan = step(s, kv)
    assert [len(i.tokens) for i in plan.items] == [300]  # the text before the image
    assert r.pending_media is r.media[0]
    assert step(s, kv).items == []  # no embeddings yet: nothing to schedule for it
    encode_pending(s)
    plan = step(s, kv)
    assert plan.items[0].pos == 300 and all(is_media_token(t) for t in plan.items[0].tokens)
    assert len(plan.items[0].tokens) == 16 and not plan.items[0].logits
    plan = step(s, kv)
    assert plan.items[0].tokens == TEXT_B and plan.items[0].logits
    check_in_sync(s, kv)


def test_causal_media_may_be_chunked_but_a_whole_one_waits_for_room() -> None:
    s, kv = make(n_batch=10)
    prompt, media = media_prompt("img", n=16, before=[1, 2])
    r = req(prompt, media)
    s.add(r)
    step(s, kv)
    encode_pending(s)
    assert [len(step(s, kv).items[0].tokens) for _ in range(2)] == [10, 6]

    s2, kv2 = make(n_batch=10)
    whole = req(*media_prompt("img", n=16, whole=True, before=[1, 2]))
    s2.add(whole)
    step(s2, kv2)
    encode_pending(s2)
    assert step(s2, kv2).items == []  # 16 positions never fit a 10-token step: never cut
    s3, kv3 = make(n_batch=32)
    whole = req(*media_prompt("img", n=16, whole=True, before=[1, 2]))
    s3.add(whole)
    step(s3, kv3)
    encode_pending(s3)
    assert len(step(s3, kv3).items[0].tokens) == 16


def test_other_requests_keep_decoding_while_a_media_waits() -> None:
    s, kv = make()
    text = req(TEXT_B)
    s.add(text)
    step(s, kv)
    image = req(*media_prompt("img"))
    s.add(image)
    for _ in range(3):  # its encoder has not run: the text stream still gets every step
        plan = step(s, kv)
        assert any(i.request is text for i in plan.items)
    assert image.pending_media is not None


def test_same_media_hits_the_cache_another_does_not() -> None:
    s, kv = make()
    first = req(*media_prompt("cat"))
    s.add(first)
    while not first.output:
        encode_pending(s)
        step(s, kv)
    s.remove(first)
    again = req(*media_prompt("cat"))
    s.add(again)
    step(s, kv)
    assert again.cached_tokens == len(again.prompt) - 1
    other = req(*media_prompt("dog"))
    s.add(other)
    step(s, kv)
    assert other.cached_tokens == 300  # the text before the image, not the image
    check_in_sync(s, kv)


def test_a_cached_prefix_ending_inside_a_media_is_cut_back_to_its_start() -> None:
    s, kv = make(n_batch=8)
    first = req(*media_prompt("cat", n=16, before=[1, 2, 3, 4, 5, 6, 7, 8]))
    s.add(first)
    step(s, kv)
    encode_pending(s)
    step(s, kv)  # 8 of the 16 image positions
    s.remove(first)  # its sequence holds the text and half the image
    again = req(*media_prompt("cat", n=16, before=[1, 2, 3, 4, 5, 6, 7, 8]))
    s.add(again)
    step(s, kv)
    assert again.cached_tokens == 8  # not 16: half an image is not reused
    check_in_sync(s, kv)


# -- adapter sets ------------------------------------------------------------------------

A = (("a", 1.0),)
B = (("b", 0.5),)


def test_steps_take_turns_between_adapter_sets_and_nobody_starves() -> None:
    s, kv = make(n_seq=6)
    reqs = [req([i, 1, 2, 3], adapters=ad) for i, ad in enumerate([(), A, B, (), A, B])]
    for r in reqs:
        s.add(r)
    served: Counter[tuple[tuple[str, float], ...]] = Counter()
    for _ in range(30):
        plan = step(s, kv)
        assert len({i.request.adapters for i in plan.items}) <= 1  # one set per step
        assert all(i.request.adapters == plan.adapters for i in plan.items)
        served[plan.adapters] += 1
    assert set(served.values()) == {10}  # three sets, ten steps each
    assert all(len(r.output) >= 9 for r in reqs)


def test_waiting_head_is_admitted_on_its_sets_turn_in_fifo_order() -> None:
    s, kv = make(n_seq=4)
    base = req([1, 2, 3])
    s.add(base)
    step(s, kv)
    head, behind = req([4, 5, 6], adapters=A), req([7, 8, 9])
    s.add(head)
    s.add(behind)
    admitted = []
    for _ in range(4):
        admitted += step(s, kv).admitted
    assert admitted[:2] == [head, behind]


@pytest.mark.parametrize("first,second", [((), A), (A, ()), (A, B)])
def test_prefix_cache_never_crosses_adapter_sets(
        first: tuple[tuple[str, float], ...], second: tuple[tuple[str, float], ...]) -> None:
    s, kv = make()
    prompt = list(range(1000, 1600))
    r1 = req(prompt, adapters=first)
    s.add(r1)
    while not r1.output:
        step(s, kv)
    s.remove(r1)
    r2 = req(prompt, adapters=second)
    s.add(r2)
    while not r2.output:
        step(s, kv)
    assert r2.cached_tokens == 0 and r2.seq_id != r1.seq_id  # its own KV, the other kept
    s.remove(r2)
    for adapters in (first, second):  # each set finds its own
        r = req(prompt, adapters=adapters)
        s.add(r)
        step(s, kv)
        assert r.cached_tokens == len(prompt) - 1
        s.remove(r)
    check_in_sync(s, kv)


# -- M-RoPE positions ---------------------------------------------------------------------


def mrope_span(start: int, nx: int, ny: int, key: str = "m") -> MediaSpan:
    return MediaSpan(start, nx * ny, key, "image", n_pos=max(nx, ny), grid=(nx, ny), mrope=True)


def test_position_map_of_mrope_images() -> None:
    # 10 text, a 4x2 image (8 tokens, 4 positions), 5 text, a 3x3 image (9, 3), text
    spans = (mrope_span(10, 4, 2), mrope_span(23, 3, 3, "n"))
    m = PositionMap.of(spans)
    assert [m.next(i) for i in (0, 9, 10)] == [0, 9, 10]
    assert [m.next(i) for i in range(11, 18)] == [10] * 7  # inside: the image's position
    assert [m.next(i) for i in (18, 22, 23, 32, 33)] == [14, 18, 19, 22, 23]
    assert m.last(18) == 10 and m.last(19) == 14 and m.last(32) == 19 and m.last(33) == 22
    assert PositionMap.of([MediaSpan(3, 4, "k", "image")]) is IDENTITY  # LLaVA-style
    assert IDENTITY.next(57) == 57 and IDENTITY.last(57) == 56


def test_row_positions_are_mtmds() -> None:
    """mtmd_image_tokens_get_decoder_pos + set_position_mrope_2d: [t, row, column, 0]."""
    rows = mrope_span(10, 4, 2).row_positions(2, 5, 10)  # rows 2..6 of a 4-wide grid
    assert rows.tolist() == [[10] * 5, [10, 10, 11, 11, 11], [12, 13, 10, 11, 12], [0] * 5]
    audio = MediaSpan(0, 3, "a", "audio", mrope=True).row_positions(0, 3, 7)
    assert audio.tolist() == [[7, 8, 9]] * 4


def test_prefix_cache_cuts_and_copies_by_position() -> None:
    """A follow-up diverging after an M-RoPE image is cut at the position of its first new
    token, not at its index; a copy covers the positions of the shared tokens."""
    s, kv = make()
    before, key = TEXT_A[:20], "img"
    prompt = [*before, *media_tokens(key, 8), *TEXT_B]
    spans = (mrope_span(20, 4, 2, key),)
    a = req(prompt, spans)
    s.add(a)
    while not a.prefill_done or not a.output:
        encode_pending(s)
        step(s, kv)
    s.remove(a)
    assert a.positions.next(len(prompt)) == len(prompt) - 4
    b = req([*prompt[:30], 9, 9, 9], spans)  # diverges 2 tokens after the image
    s.add(b)
    encode_pending(s)
    step(s, kv)
    assert b.cached_tokens == 30
    assert ("trim", b.seq_id, 26) in kv.ops  # 30 tokens hold positions 0..25
    c = req([*prompt[:29], 8, 8], spans)  # b is busy: a copy of its first 29 tokens
    s.add(c)
    encode_pending(s)
    step(s, kv)
    assert c.cached_tokens == 29 and ("copy", b.seq_id, c.seq_id, 25) in kv.ops
