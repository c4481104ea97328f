"""An LLM reranker scored from its last token's hidden state, without the LM head.

llama.cpp runs a Qwen3-Reranker-style model (causal, rank pooling, a ``cls.output`` head
made of the LM head's "yes" and "no" rows) as an embedding context, and an embedding
context outputs every token. So every prompt token goes through the LM head, all of the
vocabulary's rows (152k for Qwen), and rank pooling then reads two values of one token
per document. Here such a model runs as a generation context that outputs only each
document's last token. llama.cpp's eval callback hands over the graph's ``result_norm``
(the hidden state after the final norm, which rank pooling reads) and stops the graph
there, so the LM head is never computed. The head is then applied in numpy, as llama.cpp's
``build_pooling`` does for these architectures: ``cls.output`` times the hidden state,
then a softmax, so the first value is P(yes).

The score is llama-server's to float rounding: the same hidden state, and a two-row
product whose sums are added in another order. With an F16 or Q8_0 head the hidden state
is first rounded to that type, as ggml's matrix product does; a head of another type
leaves the model to llama.cpp's own path.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from typing import Any

import numpy as np

from engine.backends import ggml
from engine.gguf_file import Truncated, read_header, read_tensor
from engine.loading import L

log = logging.getLogger("llamaserve.engine")

# architectures whose graph ends in ``result_norm`` → LM head, and whose rank pooling takes
# the last token through ``cls.output`` and a softmax (llama.cpp's build_pooling)
ARCHITECTURES = ("qwen3", "qwen3vl")
POOLING_RANK = 4
HIDDEN = b"result_norm"
_F32, _F16, _Q8_0 = 0, 1, 8  # ggml_type: the head's types this reproduces


class LastTokenHead:
    """The classification head of a causal reranker, and the eval callback that captures
    the hidden states it reads. ``begin()`` before a decode; ``scores()`` after it."""

    def __init__(self, weight: np.ndarray, kind: int = _F32) -> None:
        self.weight = weight  # (n_cls_out, n_embd), dequantized
        self.n_embd = int(weight.shape[1])
        self.kind = kind
        self._rows: list[np.ndarray] = []
        self._bad: str | None = None
        self._lib = ggml.lib()
        self.callback = L.ggml_backend_sched_eval_callback(self._eval)

    def _eval(self, tensor: int, ask: bool, _user: Any) -> bool:
        """Called by ggml's scheduler for every node (``ask``: does the caller want its
        value?) and then with the value of each wanted node; False there ends the graph."""
        if self._lib.ggml_get_name(tensor) != HIDDEN:
            return False
        if ask:
            return True
        n = int(self._lib.ggml_nelements(tensor))
        if n % self.n_embd or int(self._lib.ggml_nbytes(tensor)) != 4 * n:
            self._bad = f"{HIDDEN.decode()} is not {self.n_embd} floats per row"
            return True
        rows = np.empty((n // self.n_embd, self.n_embd), dtype=np.float32)
        self._lib.ggml_backend_tensor_get(tensor, rows.ctypes.data_as(ctypes.c_void_p), 0,
                                          4 * n)
        self._rows.append(rows)
        return False  # what follows is the LM head, which no score reads

    def begin(self) -> None:
        self._rows.clear()
        self._bad = None

    def scores(self, n_inputs: int) -> np.ndarray:
        """The head's outputs (softmaxed, one row per input, in batch order) for the last
        decode, whose outputs were the inputs' last tokens."""
        if self._bad is not None:
            raise RuntimeError(self._bad)
        hidden = np.concatenate(self._rows) if self._rows else np.empty((0, self.n_embd))
        if hidden.shape[0] != n_inputs:
            raise RuntimeError(f"the graph gave {hidden.shape[0]} hidden states for "
                               f"{n_inputs} inputs")
        hidden = _as_operand(hidden, self.kind)
        logits = (hidden.astype(np.float64) @ self.weight.T.astype(np.float64))
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        out: np.ndarray = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return out


def _as_operand(hidden: np.ndarray, kind: int) -> np.ndarray:
    """The hidden states as ggml's product with a ``kind`` weight sees them."""
    if kind == _F16:
        return hidden.astype(np.float16).astype(np.float32)
    if kind == _Q8_0:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quantize

        q8 = GGMLQuantizationType.Q8_0
        return np.asarray(dequantize(quantize(hidden, q8), q8), np.float32)
    return hidden


def last_token_head(path: str, pooling_type: int | None) -> LastTokenHead | None:
    """The head when ``path`` is a causal reranker this applies to (an architecture of
    ``ARCHITECTURES``, rank pooling from the config or the GGUF, a ``cls.output`` of F32,
    F16 or Q8_0 rows as wide as the model); else None, and the model runs as llama.cpp
    runs it."""
    try:
        header = read_header(path)
    except (OSError, ValueError, Truncated, struct.error) as exc:
        log.debug("no last-token head: %s", exc)
        return None
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        return None
    pooling = pooling_type if pooling_type not in (None, -1) else \
        header.metadata.get(f"{arch}.pooling_type")
    info = header.tensors.get("cls.output.weight")
    n_embd = header.metadata.get(f"{arch}.embedding_length")
    if pooling != POOLING_RANK or info is None or info.type not in (_F32, _F16, _Q8_0) \
            or len(info.dims) != 2 or info.dims[0] != n_embd \
            or "cls.output.bias" in header.tensors or "cls.weight" in header.tensors:
        return None
    return LastTokenHead(read_tensor(path, info), info.type)
