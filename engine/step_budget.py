"""How many prompt tokens a step may prefill while other sequences generate, from the
engine's own step timings: pure Python, no llama.cpp.

A step's time is modelled as ``D(d) + c * p`` for ``d`` decode tokens (generating
sequences, drafts included) and ``p`` prefill tokens:

- ``D(d)``, the decode-only step time, is measured directly: an exponentially weighted
  average per decode size (interpolated between sizes seen, the nearest one outside them);
- ``c``, what one prompt token adds to a step, is a decayed least-squares line through the
  origin over the mixed steps' extra time ``t - D(d)``: fixed costs of prefill (and a
  decode step grown by the prompt's KV) are spread over the tokens at the sizes actually
  run, which is where the estimate is used. (A line with an intercept fitted over the
  narrow range of sizes a converged budget runs is too noisy: its slope swings and the
  budget with it.)

With generating sequences a step should take at most ``target`` times their decode-only
step (their inter-token latency), so the budget is ``(target - 1) * D(d) / c`` prompt
tokens, at least ``min_tokens`` (a long prompt always advances), at most ``cap``
(``model.prefill_chunk``, or ``n_batch``), and at most ``growth`` times the last budget
(a noisy low estimate never makes one long step). Until both parts are measured a small
``initial`` chunk is used; the estimates follow the context growing because old steps
weigh less.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class StepBudget:
    cap: int  # most prompt tokens per step while others generate (prefill_chunk or n_batch)
    target: float = 2.0  # a mixed step may take this many decode-only steps' time
    min_tokens: int = 4
    initial: int = 32
    alpha: float = 0.1  # weight of a new decode-only time
    decay: float = 0.95  # weight kept by older mixed steps per new one
    growth: float = 1.25  # the most the budget grows from one step to the next (+ min_tokens)
    last: int = 0  # the last budget given
    decode: dict[int, float] = field(default_factory=dict)  # D(d), seconds
    sizes: list[int] = field(default_factory=list)  # sorted decode sizes in ``decode``
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, decode_tokens: int, prefill_tokens: int, seconds: float) -> None:
        """One executed step: how many tokens of each kind it held, and how long it took."""
        if decode_tokens <= 0:
            return  # nobody generates: the step takes all it can (n_batch), nothing to fit
        if prefill_tokens <= 0:
            old = self.decode.get(decode_tokens)
            if old is None:
                bisect.insort(self.sizes, decode_tokens)
                self.decode[decode_tokens] = seconds
            else:
                self.decode[decode_tokens] = old + self.alpha * (seconds - old)
            return
        base = self.decode_seconds(decode_tokens)
        if base is None:
            return
        extra, p, d = seconds - base, float(prefill_tokens), self.decay
        self.sxx = d * self.sxx + p * p
        self.sxy = d * self.sxy + p * extra

    def decode_seconds(self, decode_tokens: int) -> float | None:
        """Measured decode-only step time for ``decode_tokens`` (None before any)."""
        sizes = self.sizes
        if not sizes:
            return None
        if decode_tokens in self.decode:
            return self.decode[decode_tokens]
        i = bisect.bisect_left(sizes, decode_tokens)
        if i == 0:
            return self.decode[sizes[0]]
        if i == len(sizes):
            return self.decode[sizes[-1]]
        a, b = sizes[i - 1], sizes[i]
        ta, tb = self.decode[a], self.decode[b]
        return ta + (tb - ta) * (decode_tokens - a) / (b - a)

    def prefill_cost(self) -> float | None:
        """Seconds one prompt token adds to a step that also decodes; None before a mixed
        step is measured. Prefill that added nothing measurable gives a tiny cost, so the
        budget grows until it does."""
        if self.sxx <= 0:
            return None
        return max(self.sxy / self.sxx, 1e-9)

    def prefill_tokens(self, decode_tokens: int) -> int:
        """Prompt tokens for a step that also decodes ``decode_tokens`` tokens."""
        if decode_tokens <= 0:
            return self.cap
        base = self.decode_seconds(decode_tokens)
        per_token = self.prefill_cost()
        if base is None or per_token is None:
            n = self.initial
        else:
            n = min(int((self.target - 1) * base / per_token),
                    int(self.last * self.growth) + self.min_tokens)
        self.last = max(1, min(self.cap, max(self.min_tokens, n)))
        return self.last
