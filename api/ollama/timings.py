"""The durations Ollama reports with a final chunk, in nanoseconds.

Measured at the API side of the engine: ``load_duration`` from the request's start until
its model was ready (routing, and loading it when it was not), ``prompt_eval_duration``
from handing the prompt to the engine until the first generated token (queueing and
prefill), ``eval_duration`` from there to the last token, ``total_duration`` the whole
request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.request import Delta


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class Timings:
    start: int = field(default_factory=now_ns)
    loaded: int = 0
    submitted: int = 0
    first: int = 0  # the first generated token arrived
    end: int = 0

    def model_ready(self) -> None:
        self.loaded = now_ns()

    def submit(self) -> None:
        self.submitted = now_ns()

    def saw(self, delta: Delta) -> None:
        if not self.first and (delta.completion_tokens or delta.finish_reason is not None):
            self.first = now_ns()

    def finish(self) -> None:
        self.end = now_ns()

    def metrics(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        end = self.end or now_ns()
        loaded = self.loaded or self.start
        submitted = self.submitted or loaded
        first = self.first or end
        return {"total_duration": end - self.start, "load_duration": loaded - self.start,
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": max(0, first - submitted),
                "eval_count": completion_tokens, "eval_duration": max(0, end - first)}
