"""Embedding jobs and how their inputs are packed into batches (pure Python).

A job is one ``/v1/embeddings`` request: a list of token lists. The engine
thread packs inputs from the queued jobs, first come first served and in input
order, into batches of at most ``max_tokens`` tokens and ``max_seqs`` inputs, so
256 short sentences are a handful of batches rather than 256 decodes, and a big
request cannot hold the engine for longer than one batch at a time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.request import EngineError

Done = Callable[[np.ndarray | None, EngineError | None], None]


@dataclass(eq=False)
class EmbedJob:
    inputs: list[list[int]]
    done: Done  # called once on the engine thread: (vectors, None) or (None, error)
    vectors: np.ndarray | None = None
    next_input: int = 0  # inputs before this one are in flight or finished
    finished_inputs: int = 0
    cancelled: bool = False

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.inputs)


@dataclass(frozen=True)
class EmbedItem:
    job: EmbedJob
    index: int  # which input of the job

    @property
    def tokens(self) -> list[int]:
        return self.job.inputs[self.index]


@dataclass
class EmbedQueue:
    max_tokens: int
    max_seqs: int
    jobs: deque[EmbedJob] = field(default_factory=deque)

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def add(self, job: EmbedJob) -> None:
        self.jobs.append(job)

    def next_batch(self) -> list[EmbedItem]:
        """Inputs for one batch; drops cancelled jobs on the way."""
        items: list[EmbedItem] = []
        tokens = 0
        for job in list(self.jobs):
            if job.cancelled:
                self.jobs.remove(job)
                continue
            while job.next_input < len(job.inputs) and len(items) < self.max_seqs:
                size = len(job.inputs[job.next_input])
                if items and tokens + size > self.max_tokens:
                    return items
                items.append(EmbedItem(job, job.next_input))
                job.next_input += 1
                tokens += size
            if len(items) >= self.max_seqs:
                break
        return items

    def complete(self, items: list[EmbedItem], vectors: np.ndarray) -> list[EmbedJob]:
        """Store a batch's vectors; returns the jobs that are now complete (and dequeued)."""
        done = []
        for row, item in enumerate(items):
            job = item.job
            if job.vectors is None:
                job.vectors = np.empty((len(job.inputs), vectors.shape[1]), dtype=np.float32)
            job.vectors[item.index] = vectors[row]
            job.finished_inputs += 1
            if job.finished_inputs == len(job.inputs):
                done.append(job)
                if job in self.jobs:
                    self.jobs.remove(job)
        return done

    def fail(self, items: list[EmbedItem]) -> list[EmbedJob]:
        """The batch failed: its jobs are dequeued and returned (each once)."""
        failed: list[EmbedJob] = []
        for item in items:
            if item.job not in failed:
                failed.append(item.job)
                if item.job in self.jobs:
                    self.jobs.remove(item.job)
        return failed
