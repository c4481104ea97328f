"""MTP drafting: a model's own multi-token-prediction layers propose the next tokens.

Models trained with MTP layers (Qwen3.5 / Qwen3-Next, DeepSeek V3 and later, GLM-4.5+)
ship them in the GGUF (``<arch>.nextn_predict_layers``); llama.cpp's modes for several
chained heads (Step-3.5: only the first is used here) and for heads sharing the target's
KV (Gemma 4 assistants) are not implemented.
llama.cpp loads them with ``load_mtp`` and runs them in a second context of type
``LLAMA_CONTEXT_TYPE_MTP`` over the same model. The MTP head at position p reads the
token at p together with the target's hidden state at p - 1 (``h_nextn``), so:

- after every target decode (prefill chunks, verification steps) ``absorb`` feeds the
  batch's tokens to the MTP context, each paired with the target's hidden row of the
  token before it (the first token of a sequence with the row carried over from the
  previous batch);
- after verification ``accept`` keeps the row of the last accepted token as the one to
  pair with next, and trims the MTP context like the target's KV;
- ``propose`` drafts for every sequence in one batch per position: the pending token
  with the carried row, then each drafted token with the MTP head's own output row
  (``draft_model_min_p`` applies to the head's probability over the whole vocabulary).

The hidden-state accessors (``llama_set_embeddings_nextn``, ``llama_get_embeddings_nextn``,
``..._ith``) live in llama.cpp's staging header ``llama-ext.h``: exported, but with C++
names, which ``NextnApi`` resolves. The orchestration (``MtpDrafter``) is pure Python
over an ``MtpBackend`` and unit-tested with a fake; the llama.cpp backend runs on the
generated Qwen3.5-architecture files (random weights in the tests; a tiny trained one in
``bench/mtp.py``, where it accepts what llama-server's ``draft-mtp`` accepts): see
docs/ENGINE.md.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("llamaserve.mtp")

Row = np.ndarray[Any, np.dtype[np.float32]]


class MtpBackend(Protocol):
    n_embd: int

    def target_rows(self, n_tokens: int) -> Row:
        """The target's hidden rows (n_tokens × n_embd) of its last decoded batch."""
        ...

    def process(self, entries: Sequence[tuple[int, int, int, Row, bool]]) -> int:
        """Decode (seq, token, position, hidden row, want output) entries in the MTP
        context, in order; batch index i is entry i. llama.cpp's status: 0 done, 1 no
        room in the KV, other values refused."""
        ...

    def top1(self, index: int, with_p: bool = True) -> tuple[int, float]:
        """The MTP head's most likely token at batch index ``index`` and its probability
        (1.0 unless ``with_p``: a softmax over the whole vocabulary costs more than the
        argmax)."""
        ...

    def row(self, index: int) -> Row:
        """The MTP head's own hidden row at batch index ``index``."""
        ...

    def seq_trim(self, seq: int, keep: int) -> None: ...

    def seq_clear(self, seq: int) -> None: ...

    def seq_end(self, seq: int) -> int:
        """One past the last position the MTP context holds for ``seq`` (0 if none)."""
        ...


@dataclass
class MtpDrafter:
    backend: MtpBackend
    min_p: float = 0.0
    pending: dict[int, Row] = field(default_factory=dict)  # row to pair with next
    rows: dict[int, Row] = field(default_factory=dict)  # last batch's rows per sequence
    known: set[int] = field(default_factory=set)  # sequences the MTP context may hold

    def _zero(self) -> Row:
        return np.zeros(self.backend.n_embd, dtype=np.float32)

    def absorb(self, entries: Sequence[tuple[int, Sequence[int], int]],
               skip: frozenset[int] = frozenset()) -> None:
        """After a target decode of ``entries`` (seq, tokens, first position), every token
        item of the batch in batch order; the sequences in ``skip`` (prompts with media:
        they never draft) only hold their rows' places."""
        total = sum(len(tokens) for _, tokens, _ in entries)
        if total == 0:
            return
        h = self.backend.target_rows(total)
        batch: list[tuple[int, int, int, Row, bool]] = []
        k = 0
        for seq, tokens, pos in entries:
            if seq in skip:
                k += len(tokens)
                continue
            if self.backend.seq_end(seq) < pos:
                # positions the target got elsewhere (prefix cache, disk): start this
                # sequence afresh (its drafts see less context, and stay correct)
                self.backend.seq_clear(seq)
                self.pending.pop(seq, None)
            else:
                self.backend.seq_trim(seq, pos)  # drafted positions from the last step
            for j, token in enumerate(tokens):
                row = self.pending.get(seq, self._zero()) if j == 0 else h[k + j - 1]
                batch.append((seq, token, pos + j, row, False))
            self.rows[seq] = h[k:k + len(tokens)].copy()
            self.pending[seq] = self.rows[seq][-1]
            k += len(tokens)
        if not batch:
            return
        status = self.backend.process(batch)
        if status == 1:  # the MTP KV is full of finished sequences: let them go
            busy = {seq for seq, _, _ in entries}
            for seq in [s for s in self.known if s not in busy]:
                self.backend.seq_clear(seq)
                self.forget(seq)
            status = self.backend.process(batch)
        if status != 0:
            log.warning("MTP context refused a batch of %d tokens (%d)", len(batch), status)
        self.known.update(seq for seq, _, _ in entries if seq not in skip)

    def accept(self, seq: int, accepted: int, keep: int) -> None:
        """After verifying ``seq``'s draft: ``accepted`` drafted tokens kept, ``keep``
        positions in the target's KV."""
        rows = self.rows.get(seq)
        if rows is not None and len(rows):
            self.pending[seq] = rows[min(accepted, len(rows) - 1)]
        self.backend.seq_trim(seq, keep)

    def forget(self, seq: int) -> None:
        self.pending.pop(seq, None)
        self.rows.pop(seq, None)
        self.known.discard(seq)

    def propose(self, work: dict[int, tuple[int, int, int]]) -> dict[int, list[int]]:
        """``work``: seq -> (pending token, its position, draft length)."""
        drafts: dict[int, list[int]] = {seq: [] for seq in work}
        batch = [(seq, token, pos, self.pending.get(seq, self._zero()), True)
                 for seq, (token, pos, k) in work.items() if k > 0]
        while batch:
            if self.backend.process(batch) != 0:
                break
            following = []
            for index, (seq, _, pos, _, _) in enumerate(batch):
                token, p = self.backend.top1(index, self.min_p > 0)
                if p < self.min_p:
                    continue
                drafts[seq].append(token)
                if len(drafts[seq]) < work[seq][2]:
                    following.append((seq, token, pos + 1, self.backend.row(index), True))
            batch = following
        return drafts


# -- llama.cpp ----------------------------------------------------------------------

NEXTN_SYMBOLS = {  # C name (if a release exports one), then the Itanium C++ name
    "set": ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb"),
    "get": ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context"),
    "get_ith": ("llama_get_embeddings_nextn_ith",
                "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"),
}


@dataclass
class NextnApi:
    set: Any
    get: Any
    get_ith: Any

    @classmethod
    def load(cls, lib: Any) -> NextnApi | None:
        found: dict[str, Any] = {}
        for key, names in NEXTN_SYMBOLS.items():
            for name in names:
                fn = getattr(lib, name, None)
                if fn is not None:
                    found[key] = fn
                    break
            else:
                return None
        found["set"].argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
        found["set"].restype = None
        found["get"].argtypes = [ctypes.c_void_p]
        found["get"].restype = ctypes.POINTER(ctypes.c_float)
        found["get_ith"].argtypes = [ctypes.c_void_p, ctypes.c_int32]
        found["get_ith"].restype = ctypes.POINTER(ctypes.c_float)
        return cls(**found)
