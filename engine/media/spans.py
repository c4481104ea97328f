"""Media in a prompt, as the scheduler and the prefix cache see it. Pure Python.

A prompt with an image is still a list of ints: the image's positions hold *media
tokens*, negative ids derived from the media's content hash and the position inside
it. Real token ids are never negative, so the prefix tree, the prefix cache and the
disk cache need no special case: the same image again matches, another image with the
same text does not, and a match can only cover a whole image once rounded down with
``reusable``. A ``MediaSpan`` says where the media sits and carries what the runner
feeds for it (the encoded embeddings, one row per position).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MEDIA_TOKEN_SPACE = (1 << 31) - 2  # media tokens are -2 .. -(2**31 - 1): int32 like tokens


def media_tokens(key: str, n: int) -> list[int]:
    """The ``n`` media tokens of the media whose content hash is ``key`` (hex): distinct per
    position, the same on every run (disk-cache entries stay valid across restarts)."""
    raw = hashlib.shake_256(f"llamaserve-media:{key}".encode()).digest(4 * n)
    values = np.frombuffer(raw, dtype="<u4").astype(np.int64) % MEDIA_TOKEN_SPACE
    return [int(v) for v in -(values + 2)]


def is_media_token(token: int) -> bool:
    return token < -1


@dataclass(eq=False)
class MediaSpan:
    """One image or audio clip inside a request's prompt."""

    start: int  # index of its first position in the prompt
    n_tokens: int
    key: str  # content hash (hex) of the media bytes
    kind: str  # "image" | "audio"
    whole: bool = False  # evaluated in one micro-batch (non-causal attention inside it)
    chunk: Any = None  # the projector's tokenized input, until encoded or released
    embd: np.ndarray | None = None  # (n_tokens, n_embd) float32 once encoded

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    def fresh(self) -> MediaSpan:
        """The same media for another request (each choice gets its own embeddings; the
        chunk is shared)."""
        return MediaSpan(self.start, self.n_tokens, self.key, self.kind, self.whole, self.chunk)


def span_at(spans: Sequence[MediaSpan], pos: int) -> MediaSpan | None:
    """The span holding prompt position ``pos``, if any."""
    for s in spans:
        if s.start <= pos < s.end:
            return s
        if s.start > pos:
            return None
    return None


def segment_end(spans: Sequence[MediaSpan], pos: int, prompt_len: int) -> int:
    """End of the run starting at ``pos`` that is all text or all one media: a prefill
    chunk never mixes them (text and embeddings are decoded in different batches)."""
    for s in spans:
        if s.start <= pos < s.end:
            return s.end
        if s.start > pos:
            return s.start
    return prompt_len


def reusable(spans: Sequence[MediaSpan], n: int) -> int:
    """``n`` cached positions, rounded down to the start of a media they would cut (a
    media is evaluated whole: some projectors attend across all of its positions)."""
    s = span_at(spans, n)
    return s.start if s is not None and s.start < n else n
