"""The logits a sampler reads, without copying the vocabulary (engine thread).

``llama_sampler_sample`` starts by copying every logit of the vocabulary into a candidate
array. ``Candidates`` gives the samplers cheaper views: a logits row as a numpy view
(``row``), the logits at or above a floor that follows the request from token to token
(``windowed``: a top_k chain picks the same token from any candidates that contain the k
best), and, when every candidate is needed, one reusable array over the whole vocabulary
(``every``).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Protocol

import llama_cpp
import numpy as np

L: Any = llama_cpp  # the C API, untyped (see engine.runner)

# a window's next floor lets in about this many times k of the current logits (at least
# WINDOW_MIN_RANKS): a margin for the next token's logits to lie lower
WINDOW_RANKS = 4
WINDOW_MIN_RANKS = 256
WINDOW_MAX_RANKS = 16  # a floor that lets in more than this many times the target: read again
SUBSAMPLE = 16  # a floor that lets too few in is re-read from every SUBSAMPLE-th logit
MAX_ROW_VIEWS = 4096  # logits row views kept (one per batch position in use)

# llama_token_data {id, logit, p} as a numpy record, for candidate arrays built in numpy
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_NONE = np.zeros(0, np.intp)


def _address_binding() -> Any:
    """``llama_get_logits_ith`` returning the address as an int (the bindings' version
    returns a ctypes float pointer, slower to turn into a numpy view)."""
    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
    return fn(("llama_get_logits_ith", L.llama_cpp._lib))


_logits_address = _address_binding()


class Floored(Protocol):
    """A request's sampler state that remembers where its next window starts."""

    floor: float


def _estimated_floor(row: Any, k: int, wanted: int) -> tuple[Any, float] | None:
    """The ids at or above a floor that lets in at least ``k`` of ``row`` (about ``wanted``),
    and that floor; None when no try finds ``k``. The floor is read from every
    ``SUBSAMPLE``-th logit (the ``wanted / SUBSAMPLE``-th best of them; four times deeper
    each try, three at most), so a model sure of its token (the k-th best 20 under the
    best) no longer gets a window of the whole vocabulary, as widening a window under the
    highest logit gave it."""
    sub = row[::SUBSAMPLE]
    m = max(1, wanted // SUBSAMPLE)
    for _ in range(3):
        m = min(m, len(sub))
        floor = float(np.partition(sub, len(sub) - m)[len(sub) - m])
        if not math.isfinite(floor):  # (mostly -inf: the whole vocabulary is the path)
            return None
        ids = np.flatnonzero(row >= np.float32(floor))
        if len(ids) >= k:
            return ids, floor
        if m == len(sub):
            return None
        m *= 4
    return None


def token_array(buffer: Any, n: int, is_sorted: bool = False) -> Any:
    """A llama_token_data_array over the first ``n`` records of ``buffer`` (TOKEN_DATA)."""
    return L.llama_token_data_array(buffer.ctypes.data_as(L.llama_token_data_p), n, -1,
                                    is_sorted)


class Candidates:
    """One context's logits views and candidate buffers (reused from token to token)."""

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab
        self._row_type = ctypes.c_float * n_vocab
        self._rows: dict[int, Any] = {}  # numpy views of logits rows, by address
        self._above = np.empty(n_vocab, np.bool_)  # which logits clear a window's floor
        # the window's candidates (grown on demand)
        self.n_window = 0
        self.window: Any = None
        self.window_ids: Any = None
        self._window_fields: tuple[Any, Any, Any] = (None, None, None)  # its columns
        self._window_ptr: Any = None
        # every candidate, made on first use
        self.all: Any = None
        self._all_ids: Any = None
        self._all_ptr: Any = None

    def row(self, batch_index: int) -> Any:
        """The output row of batch position ``batch_index``, as a numpy view."""
        address = _logits_address(self.ctx, batch_index)
        if not address:
            raise ValueError(f"no logits at batch position {batch_index}")
        row = self._rows.get(address)  # a view is only an address and a length: the same
        if row is None:  # address is the same row, whatever buffer holds it now
            if len(self._rows) >= MAX_ROW_VIEWS:
                self._rows.clear()
            row = self._rows[address] = np.frombuffer(
                self._row_type.from_address(address), dtype=np.float32)  # type: ignore[call-overload]
        return row

    def windowed(self, row: Any, c: Floored, k: int) -> Any:
        """The logits at or above ``c.floor``, in id order as llama.cpp's array is, as a
        llama_token_data_array over the window buffer, when at least ``k`` are there. With
        too few the floor is estimated again from a sample of the row (``_estimated_floor``;
        None when that fails). The next token's floor is set to let about ``WINDOW_RANKS * k``
        of this token's logits in."""
        target = max(WINDOW_RANKS * k, WINDOW_MIN_RANKS)
        ids = _NONE
        if c.floor > -np.inf:  # (a float32 floor: a Python float costs a third more)
            np.greater_equal(row, np.float32(c.floor), out=self._above)
            ids = self._above.nonzero()[0]
            if len(ids) > WINDOW_MAX_RANKS * target:  # the logits rose past the floor
                ids = _NONE
        if len(ids) < k:
            found = _estimated_floor(row, k, 2 * target)
            if found is None:
                c.floor = -np.inf
                return None
            ids, c.floor = found  # (the adjustments below start from it)
        n = len(ids)
        if n > self.n_window:
            self._grow_window(n)
        logits = row[ids]
        if n > 2 * target:  # too wide: raise the floor to the target's rank
            c.floor = float(np.partition(logits, n - target)[n - target])
        elif n < 2 * k:  # nearly too narrow: lower it by the spread of the k best
            c.floor -= float(logits.max()) - float(np.partition(logits, n - k)[n - k])
        cand_id, cand_logit, cand_p = self._window_fields
        cand_id[:n] = ids
        cand_logit[:n] = logits
        cand_p[:n] = 0.0
        return L.llama_token_data_array(self._window_ptr, n, -1, False)

    def _grow_window(self, n: int) -> None:
        self.n_window = min(self.n_vocab, max(n, 2 * self.n_window))
        self.window = np.zeros(self.n_window, TOKEN_DATA)
        self._window_fields = (self.window["id"], self.window["logit"], self.window["p"])
        self.window_ids = self._window_fields[0]
        self._window_ptr = ctypes.cast(self.window.ctypes.data, L.llama_token_data_p)

    def every(self, batch_index: int) -> Any:
        """Every token with its logit, in id order, as a llama_token_data_array over the
        reusable buffer ``all`` (the samplers reorder it in place)."""
        if self.all is None:
            self.all = np.zeros(self.n_vocab, TOKEN_DATA)
            self._all_ids = np.arange(self.n_vocab, dtype=np.int32)
            self._all_ptr = self.all.ctypes.data_as(L.llama_token_data_p)
        ptr = L.llama_get_logits_ith(self.ctx, batch_index)
        self.all["id"] = self._all_ids
        self.all["logit"] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        self.all["p"] = 0.0
        return L.llama_token_data_array(self._all_ptr, self.n_vocab, -1, False)
