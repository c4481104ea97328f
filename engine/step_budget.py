"""How many prompt tokens a step may prefill while other sequences generate, from the
engine's own step timings: pure Python, no llama.cpp.

A step's time is modelled as ``D(d) + c0 + c * p`` for ``d`` decode tokens (generating
sequences, drafts included) and ``p`` prefill tokens:

- ``D(d)``, the decode-only step time, is measured directly: an exponentially weighted
  average per decode size (interpolated between sizes seen, the nearest one outside them);
- ``c0`` and ``c``, what prefill adds to a step, are a decayed least-squares line over the
  mixed steps' extra time ``t - D(d)`` (a line through the origin while the prefill sizes
  seen are too alike to separate the two, i.e. the average cost per prompt token).

With generating sequences a step should take at most ``target`` times their decode-only
step (their inter-token latency), so the budget is ``((target - 1) * D(d) - c0) / c``
prompt tokens, at least ``min_tokens`` (a long prompt always advances) and at most
``cap`` (``model.prefill_chunk``, or ``n_batch``). Until both parts are measured, a
small ``initial`` chunk is used; the estimates follow the context growing because old
steps weigh less.
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
    decode: dict[int, float] = field(default_factory=dict)  # D(d), seconds
    sizes: list[int] = field(default_factory=list)  # sorted decode sizes in ``decode``
    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
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
        self.w = d * self.w + 1
        self.sx = d * self.sx + p
        self.sy = d * self.sy + extra
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

    def prefill_cost(self) -> tuple[float, float] | None:
        """(fixed, per prompt token) seconds prefill adds to a step; None before a mixed
        step is measured."""
        if self.w <= 0 or self.sxx <= 0:
            return None
        var = self.w * self.sxx - self.sx * self.sx
        if self.w >= 4 and var > 0.01 * self.w * self.sxx:  # sizes spread enough for a line
            per_token = (self.w * self.sxy - self.sx * self.sy) / var
            fixed = (self.sy - per_token * self.sx) / self.w
            if per_token > 0 and fixed >= 0:
                return fixed, per_token
        # the average, fixed costs spread over the tokens; prefill that added nothing
        # measurable is tried at the cap next (its cost is then measured there)
        return 0.0, max(self.sxy / self.sxx, 1e-9)

    def prefill_tokens(self, decode_tokens: int) -> int:
        """Prompt tokens for a step that also decodes ``decode_tokens`` tokens."""
        if decode_tokens <= 0:
            return self.cap
        base = self.decode_seconds(decode_tokens)
        cost = self.prefill_cost()
        if base is None or cost is None:
            n = self.initial
        else:
            fixed, per_token = cost
            n = int(((self.target - 1) * base - fixed) / per_token)
        return max(1, min(self.cap, max(self.min_tokens, n)))
