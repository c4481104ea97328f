"""Media in a prompt, as the scheduler and the prefix cache see it. Pure Python.

A prompt with an image is still a list of ints: the image's positions hold *media
tokens*, negative ids derived from the media's content hash and the position inside
it. Real token ids are never negative, so the prefix tree, the prefix cache and the
disk cache need no special case: the same image again matches, another image with the
same text does not, and a match can only cover a whole image once rounded down with
``reusable``. A ``MediaSpan`` says where the media sits and carries what the runner
feeds for it (the encoded embeddings, one row per token).

With M-RoPE (the Qwen-VL family) a media takes ``n_tokens`` KV cells but advances the
sequence position by only ``n_pos`` (``max(nx, ny)`` for an image): every cell of an
image sits at the image's first position, with its row and column in the other rope
sections. ``PositionMap`` turns prompt indices into KV positions. It depends only on the
tokens before an index (the same media tokens mean the same media, the same grid, the
same ``n_pos``), so a request's map is also right for any cached sequence, copy or disk
entry sharing a prefix with it: the prefix cache cuts and copies through the request's map.
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
    n_pos: int | None = None  # positions it advances the sequence by (None: n_tokens)
    grid: tuple[int, int] | None = None  # M-RoPE image: (nx, ny), row-major tokens
    mrope: bool = False  # four position components per embedding row

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    @property
    def advance(self) -> int:
        return self.n_tokens if self.n_pos is None else self.n_pos

    def fresh(self) -> MediaSpan:
        """The same media for another request (each choice gets its own embeddings; the
        chunk is shared)."""
        return MediaSpan(self.start, self.n_tokens, self.key, self.kind, self.whole, self.chunk,
                         n_pos=self.n_pos, grid=self.grid, mrope=self.mrope)

    def row_positions(self, first: int, k: int, p0: int) -> np.ndarray:
        """The (4, k) M-RoPE positions of embedding rows ``first .. first + k`` when the
        media starts at position ``p0``, as mtmd's helper sets them: sections [t, row,
        column, 0] for an image (``set_position_mrope_2d``), ``p0 + i`` in all four for
        audio (``set_position_mrope_1d``)."""
        i = np.arange(first, first + k, dtype=np.int32)
        out = np.empty((4, k), dtype=np.int32)
        if self.grid is None:
            out[:] = p0 + i
            return out
        nx = self.grid[0]
        out[0] = p0
        out[1] = p0 + i // nx
        out[2] = p0 + i % nx
        out[3] = 0
        return out


@dataclass(frozen=True)
class PositionMap:
    """Prompt index → KV position (llama.cpp's first rope section) for a prompt whose media
    advance the position by less than their token count; text has one position per token.
    Without such media (every model but M-RoPE ones) it is the identity."""

    shrinking: tuple[tuple[int, int, int], ...] = ()  # (start, end, n_pos) per such media

    @staticmethod
    def of(spans: Sequence[MediaSpan]) -> PositionMap:
        shrinking = tuple((s.start, s.end, s.advance) for s in spans if s.advance != s.n_tokens)
        return PositionMap(shrinking) if shrinking else IDENTITY

    def next(self, n: int) -> int:
        """The position the token at index ``n`` takes: where ``seq_rm`` cuts to keep the
        first ``n`` tokens (inside a media: the media's own position, all of it goes)."""
        shift = 0
        for start, end, n_pos in self.shrinking:
            if n >= end:
                shift += end - start - n_pos
            elif n > start:
                return start - shift
            else:
                break
        return n - shift

    def last(self, n: int) -> int:
        """The position of the cell of token ``n - 1`` (the sequence's highest position
        once it holds ``n`` tokens)."""
        for start, end, _ in self.shrinking:
            if start < n <= end:
                return self.next(start)
        return self.next(n - 1)


IDENTITY = PositionMap()


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
