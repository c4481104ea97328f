"""When the grammar need only be checked on the best few candidates (pure logic, numpy).

llama.cpp's grammar sampler tests every candidate it is given against the grammar; over a
151k-token vocabulary that is most of a constrained step. The runner instead sorts out the
``CHECK`` best candidates (after the pointwise samplers: logit bias, penalties), asks the
grammar about those only, and uses this module to decide whether that is enough to give
exactly what the full path (grammar over every candidate, then the same samplers) gives;
if not, it tries the best ``32 * CHECK``, and only then every candidate:

- greedy: the best allowed candidate is the answer when its logit is above the last checked
  one's (nothing unchecked can tie or beat it); ties go to the lowest id, as llama.cpp's
  greedy sampler over the id-ordered array does.
- sampling, ``top_k`` K: the K best allowed tokens are all among the checked ones when
  the K-th allowed logit is above the last checked one's; top_k keeps exactly those, and
  top_p / min_p / temperature / dist then see the same array as on the full path.
- sampling with ``min_p`` Q: unchecked tokens (logit <= the last checked one's) can never
  pass min_p when that logit is below ``best allowed + log Q``; then the final set is the
  allowed checked tokens passing min_p, provided top_p did not cut inside them, which only
  gets less likely as more (unchecked) probability mass joins the normalization — so the
  runner applies the truncation samplers to the checked tokens and takes the result only if
  it kept ``expected`` tokens.

Anything else (no allowed token among the checked ones, pure temperature sampling, top_p
without min_p or top_k) falls back to the full path, so the result is always the full path's
result: the same token for the same logits and seed — the runner hands the samplers the
checked tokens in the order the full path's array has when dist draws (best first, or id
order under min_p alone), up to exact logit ties, whose order llama.cpp's sort leaves
unspecified either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

CHECK = 128  # candidates checked against the grammar first (<= 128: std::partial_sort)
_MARGIN = 1e-3  # logit distance kept from every threshold (float rounding in C vs numpy)


@dataclass(frozen=True)
class Truncation:
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # >= 1: off
    min_p: float = 0.0  # <= 0: off

    @property
    def sorts(self) -> bool:
        """Whether llama.cpp's truncation leaves the candidates sorted best first (top_k and
        top_p sort; min_p alone keeps them in id order), which is the order dist draws in."""
        return self.top_k > 0 or self.top_p < 1.0


@dataclass(frozen=True)
class Plan:
    """The checked allowed tokens decide the result; ``expected`` (if set) is how many
    tokens the truncation samplers must keep for that to hold."""

    expected: int | None = None


def allowed_sorted(ids: npt.NDArray[np.int32], logits: npt.NDArray[np.float32]
                   ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """The candidates the grammar allowed (finite logit), best first, ties by lowest id."""
    keep = np.isfinite(logits)
    ids, logits = ids[keep], logits[keep]
    order = np.lexsort((ids, -logits))
    return ids[order], logits[order]


def greedy_choice(ids: npt.NDArray[np.int32], logits: npt.NDArray[np.float32],
                  boundary: float) -> int | None:
    """The greedy token from the allowed checked candidates (``allowed_sorted``), or None
    when an unchecked one (logit <= ``boundary``) could tie or beat it."""
    if len(ids) == 0 or not logits[0] > boundary:
        return None
    return int(ids[0])


def sampling_plan(logits: npt.NDArray[np.float32], boundary: float,
                  t: Truncation) -> Plan | None:
    """Whether the allowed checked candidates (``allowed_sorted`` logits) decide what the
    truncation samplers keep; None: the full path is needed."""
    n = len(logits)
    if n == 0:
        return None
    if 0 < t.top_k <= n and logits[t.top_k - 1] > boundary:
        return Plan()
    if t.min_p <= 0.0:
        return None
    threshold = float(logits[0]) + math.log(t.min_p)
    if not boundary < threshold - _MARGIN:
        return None
    kept = logits[:t.top_k] if t.top_k > 0 else logits
    if np.any(np.abs(kept - threshold) < _MARGIN):
        return None  # too close to call against C's float arithmetic
    return Plan(int(np.count_nonzero(kept >= threshold)))
