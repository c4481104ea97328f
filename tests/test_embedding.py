"""Packing embedding inputs into batches, with no model."""

from __future__ import annotations

import numpy as np

from engine.embeddings.jobs import EmbedJob, EmbedQueue
from engine.request import EngineError


def job(*lengths: int) -> EmbedJob:
    return EmbedJob([[7] * n for n in lengths], done=lambda v, e: None)


def test_inputs_of_several_jobs_share_a_batch_in_order() -> None:
    q = EmbedQueue(max_tokens=100, max_seqs=4)
    a, b = job(10, 10, 10), job(5, 5, 5)
    q.add(a)
    q.add(b)
    first = q.next_batch()
    assert [(i.job is a, i.index) for i in first] == [(True, 0), (True, 1), (True, 2),
                                                      (False, 0)]
    done = q.complete(first, np.ones((4, 3), dtype=np.float32))
    assert done == [a] and a.vectors is not None and a.vectors.shape == (3, 3)
    second = q.next_batch()
    assert [(i.job is b, i.index) for i in second] == [(True, 1), (True, 2)]
    assert q.complete(second, np.zeros((2, 3), dtype=np.float32)) == [b]
    assert not q


def test_token_budget_splits_batches_but_a_single_input_always_fits() -> None:
    q = EmbedQueue(max_tokens=20, max_seqs=16)
    q.add(job(15, 15, 30))
    assert [i.index for i in q.next_batch()] == [0]
    assert [i.index for i in q.next_batch()] == [1]
    assert [i.index for i in q.next_batch()] == [2]  # alone, over budget: the caller checked
    assert q.next_batch() == []


def test_cancelled_jobs_are_dropped_and_failures_reported_once() -> None:
    q = EmbedQueue(max_tokens=100, max_seqs=8)
    gone, live = job(3), job(3, 3)
    gone.cancelled = True
    q.add(gone)
    q.add(live)
    items = q.next_batch()
    assert {i.job for i in items} == {live}
    assert q.fail(items) == [live] and not q
    errors: list[EngineError | None] = []
    failing = EmbedJob([[1]], done=lambda v, e: errors.append(e))
    q.add(failing)
    for j in q.fail(q.next_batch()):
        j.done(None, EngineError("boom"))
    assert len(errors) == 1
