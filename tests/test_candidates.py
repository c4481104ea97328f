"""engine.sampling.candidates: a window of logits is always a complete upper set of its row
(every logit at or above its lowest is in it, in id order), holds at least the k best, and
stays near its target size when the logits move past the floor (a model sure of its token,
logits shifted up or down from one token to the next)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.candidates import (
    WINDOW_MAX_RANKS,
    WINDOW_MIN_RANKS,
    WINDOW_RANKS,
    Candidates,
)

N_VOCAB = 50_000


@dataclass
class Floor:
    floor: float = -np.inf


def row_of(seed: int, scale: float, peak: float, shift: float) -> np.ndarray:
    """Logits like a model's: most near zero, a few far above (a sure model: ``peak``)."""
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(N_VOCAB).astype(np.float32) * np.float32(scale)
    top = rng.choice(N_VOCAB, size=8, replace=False)
    row[top] += np.float32(peak) * rng.random(8).astype(np.float32)
    return row + np.float32(shift)


def check_window(cand: Candidates, row: np.ndarray, got: object, k: int) -> None:
    n = got.size  # type: ignore[attr-defined]
    ids = cand.window["id"][:n]
    logits = cand.window["logit"][:n]
    assert n >= k
    assert np.all(np.diff(ids) > 0)  # id order, as llama.cpp's array
    assert np.array_equal(logits, row[ids])
    lowest = logits.min()
    assert n == np.count_nonzero(row >= lowest)  # complete: nothing above it left out
    best_k = np.argpartition(row, N_VOCAB - k)[N_VOCAB - k:]
    assert np.isin(best_k, ids).all()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=6),
       k=st.integers(1, 200),
       scale=st.sampled_from([0.5, 2.0, 5.0]),
       peak=st.sampled_from([0.0, 10.0, 40.0]),
       shifts=st.lists(st.sampled_from([0.0, -30.0, 30.0, 5.0]), min_size=6, max_size=6))
def test_a_window_is_a_complete_upper_set_near_its_target(
        seeds: list[int], k: int, scale: float, peak: float, shifts: list[float]) -> None:
    cand = Candidates(None, N_VOCAB)
    c = Floor()
    target = max(WINDOW_RANKS * k, WINDOW_MIN_RANKS)
    for seed, shift in zip(seeds, shifts, strict=False):
        row = row_of(seed, scale, peak, shift)
        got = cand.windowed(row, c, k)
        assert got is not None  # every row here has k finite logits
        check_window(cand, row, got, k)
        # never the whole vocabulary because the logits rose past the last floor
        assert got.size <= max(WINDOW_MAX_RANKS * target, 64 * k), (got.size, target)


def test_too_few_finite_logits_give_no_window() -> None:
    """(the caller then samples the whole vocabulary, as llama.cpp does)"""
    cand = Candidates(None, N_VOCAB)
    row = np.full(N_VOCAB, -np.inf, np.float32)
    row[:3] = [1.0, 2.0, 3.0]
    assert cand.windowed(row, Floor(), 8) is None
