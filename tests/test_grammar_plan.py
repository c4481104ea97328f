"""Checking the grammar on the best candidates first (engine/sampling/grammar_plan.py): whenever
the plan says the checked tokens decide the result, the result is what checking every
candidate gives. A numpy model of llama.cpp's samplers (top_k, top_p, min_p, greedy)
plays the full path on random logits and random allowed sets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.sampling.grammar_plan import (
    CHECK,
    Truncation,
    allowed_sorted,
    greedy_choice,
    sampling_plan,
)

VOCAB = 3000


def truncate(ids: np.ndarray, logits: np.ndarray, t: Truncation) -> frozenset[int]:
    """llama.cpp's top_k -> top_p -> min_p on candidates sorted best first (-inf: banned)."""
    if t.top_k > 0:
        ids, logits = ids[:t.top_k], logits[:t.top_k]
    if t.top_p < 1.0:
        p = np.exp(logits - logits[0])
        cum = np.cumsum(p / p.sum())
        hit = np.nonzero(cum >= t.top_p)[0]
        last = int(hit[0]) + 1 if len(hit) else len(ids)
        ids, logits = ids[:last], logits[:last]
    if t.min_p > 0.0:
        threshold = logits[0] + math.log(t.min_p)
        i = 1
        while i < len(ids) and logits[i] >= threshold:
            i += 1
        ids, logits = ids[:i], logits[:i]
    return frozenset(int(x) for x, v in zip(ids, logits, strict=True) if np.isfinite(v))


def full_path(logits: np.ndarray, allowed: np.ndarray, t: Truncation) -> frozenset[int]:
    masked = np.where(allowed, logits, -np.inf).astype(np.float32)
    ids = np.arange(len(logits), dtype=np.int32)
    order = np.lexsort((ids, -masked))
    return truncate(ids[order], masked[order], t)


def checked(logits: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """What the runner sees: the best CHECK candidates, the grammar applied to them."""
    order = np.argsort(-logits, kind="stable")[:CHECK]
    head = np.where(allowed[order], logits[order], -np.inf).astype(np.float32)
    ids, vals = allowed_sorted(order.astype(np.int32), head)
    return ids, vals, float(logits[order[-1]])


def random_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    scale = rng.choice([0.5, 2.0, 6.0])
    logits = (rng.standard_normal(VOCAB) * scale).astype(np.float32)
    if rng.random() < 0.3:  # ties
        logits = np.round(logits, 0).astype(np.float32)
    density = rng.choice([0.002, 0.02, 0.3, 0.95])
    allowed = rng.random(VOCAB) < density
    if rng.random() < 0.5:  # the model mostly wants an allowed token
        best = rng.choice(np.nonzero(allowed)[0]) if allowed.any() else 0
        allowed[best] = True
        logits[best] = logits.max() + rng.uniform(0.0, 4.0)
    return logits, allowed


TRUNCATIONS = [Truncation(40, 0.95, 0.05), Truncation(40, 1.0, 0.0), Truncation(0, 1.0, 0.1),
               Truncation(0, 0.9, 0.05), Truncation(5, 0.5, 0.2), Truncation(200, 0.95, 0.05),
               Truncation(0, 1.0, 0.0), Truncation(0, 0.95, 0.0)]


@pytest.mark.parametrize("t", TRUNCATIONS, ids=str)
def test_plan_gives_the_full_paths_kept_set(t: Truncation) -> None:
    rng = np.random.default_rng(hash(t) % 2**32)
    decided = 0
    for _ in range(400):
        logits, allowed = random_case(rng)
        ids, vals, boundary = checked(logits, allowed)
        plan = sampling_plan(vals, boundary, t)
        if plan is None:
            continue
        fast = truncate(ids, vals, t)  # the runner runs the same samplers on these
        if plan.expected is not None and len(fast) != plan.expected:
            continue  # the runner falls back
        decided += 1
        assert fast == full_path(logits, allowed, t)
    if t.top_k or t.min_p:
        assert decided > 50  # the fast path is taken, not only safe
    else:
        assert decided == 0  # pure temperature / top_p alone: always the full path


def test_greedy_choice_is_the_best_allowed_token_lowest_id_on_ties() -> None:
    rng = np.random.default_rng(1)
    decided = 0
    for _ in range(2000):
        logits, allowed = random_case(rng)
        ids, vals, boundary = checked(logits, allowed)
        token = greedy_choice(ids, vals, boundary)
        if token is None:
            continue
        decided += 1
        masked = np.where(allowed, logits, -np.inf)
        assert token == int(np.argmax(masked))  # argmax: first (lowest id) of the maxima
    assert decided > 500


def test_nothing_allowed_among_the_checked_means_full_path() -> None:
    empty = np.zeros(0, dtype=np.float32)
    assert greedy_choice(np.zeros(0, dtype=np.int32), empty, 0.0) is None
    assert sampling_plan(empty, 0.0, Truncation(40, 0.95, 0.05)) is None


def test_a_tie_with_the_boundary_is_not_decided() -> None:
    vals = np.array([1.0, 0.5], dtype=np.float32)
    ids = np.array([7, 3], dtype=np.int32)
    assert greedy_choice(ids, vals, 1.0) is None  # an unchecked token may also be 1.0
    assert greedy_choice(ids, vals, 0.99) == 7
    assert sampling_plan(vals, 0.5, Truncation(2, 1.0, 0.0)) is None
    assert sampling_plan(vals, 0.4, Truncation(2, 1.0, 0.0)) is not None


def test_allowed_sorted_drops_rejected_and_orders_ties_by_id() -> None:
    ids = np.array([5, 2, 9, 4], dtype=np.int32)
    vals = np.array([1.0, -np.inf, 2.0, 2.0], dtype=np.float32)
    out_ids, out_vals = allowed_sorted(ids, vals)
    assert out_ids.tolist() == [4, 9, 5] and out_vals.tolist() == [2.0, 2.0, 1.0]
