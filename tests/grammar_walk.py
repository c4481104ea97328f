"""Random walks through a grammar with llama.cpp's own grammar sampler: what a random-weight
model under that grammar could write, without a model. And ``TextChecker``: whether
llama.cpp's grammar sampler allows a given text, token by token.

Each step draws random logits (Gumbel noise, so the pick is a sample of a softmax) over
the vocabulary's short tokens plus end-of-generation, lets llama.cpp's grammar sampler rule
out what the grammar forbids, and takes the best of what is left (the whole vocabulary
when no short token fits). End-of-generation, once the grammar allows it, is likely: the
walk ends when the grammar's text is complete. A walk that reaches its step limit is cut
off, as an answer at ``max_tokens``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

SHORT = 3  # bytes of the tokens drawn first
FIRST = 64  # candidates the grammar is asked about before all of them
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class TextChecker:
    """Whether llama.cpp's grammar sampler (the engine's authority) allows a text: its
    tokens one by one (a token the grammar forbids gets logit -inf before it would be
    accepted), then the end (end-of-generation must be allowed there). Any tokenization
    does: the grammar reads each token's text."""

    def __init__(self, path: str) -> None:
        import llama_cpp as L

        self.L = L
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), params)
        assert self.model
        self.vocab = L.llama_model_get_vocab(self.model)
        self.eos = L.llama_vocab_eos(self.vocab)

    def sampler(self, grammar: str) -> Any | None:
        """llama.cpp's grammar sampler (None: llama.cpp could not parse the grammar)."""
        return self.L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root") or None

    def free(self, sampler: Any) -> None:
        self.L.llama_sampler_free(sampler)

    def _allowed(self, sampler: Any, token: int) -> bool:
        L = self.L
        data = (L.llama_token_data * 1)(L.llama_token_data(token, 0.0, 0.0))
        arr = L.llama_token_data_array(data, 1, -1, False)
        L.llama_sampler_apply(sampler, ctypes.byref(arr))
        return bool(data[0].logit != float("-inf"))

    def tokens(self, text: str) -> list[int]:
        L = self.L
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
        assert n >= 0
        return list(buf[:n])

    def allows(self, sampler: Any, text: str) -> bool:
        """Whether ``sampler`` (fresh, or reset) allows ``text`` whole; it is left past the
        tokens it took."""
        for tok in self.tokens(text):
            if not self._allowed(sampler, tok):
                return False
            self.L.llama_sampler_accept(sampler, tok)
        return self._allowed(sampler, self.eos)

    def accepts(self, grammar: str, text: str) -> bool:
        sampler = self.sampler(grammar)
        assert sampler, "llama.cpp could not parse the grammar:\n" + grammar
        try:
            return self.allows(sampler, text)
        finally:
            self.free(sampler)

    def close(self) -> None:
        self.L.llama_model_free(self.model)


class GrammarWalker(TextChecker):
    def __init__(self, path: str, closing: tuple[bytes, ...] = (b'"', b"}", b"]", b","),
                 bias: float = 2.5) -> None:
        super().__init__(path)
        L = self.L
        n = L.llama_vocab_n_tokens(self.vocab)
        self.pieces: list[bytes] = []
        buf = ctypes.create_string_buffer(256)
        for t in range(n):
            k = L.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, False)
            self.pieces.append(buf.raw[:max(k, 0)])
        short = [t for t, p in enumerate(self.pieces) if 0 < len(p) <= SHORT]
        self.short = np.array([*short, self.eos], dtype=np.int32)
        self.all = np.arange(n, dtype=np.int32)
        # closing tokens drawn more often, so strings and objects end within the walk
        closes = np.array([any(c in p for c in closing) for p in self.pieces])
        self.bias = {"short": np.where(closes[self.short], bias, 0.0),
                     "all": np.where(closes, bias, 0.0)}
        self.bias["short"][-1] = self.bias["all"][self.eos] = 4.0

    def _apply(self, sampler: Any, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The logits with what the grammar forbids at -inf (llama_token_data rows in a
        numpy array handed to the sampler as they are)."""
        L = self.L
        rows = np.zeros(len(ids), dtype=TOKEN_DATA)
        rows["id"], rows["logit"] = ids, logits
        arr = L.llama_token_data_array(rows.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
                                       len(ids), -1, False)
        L.llama_sampler_apply(sampler, ctypes.byref(arr))
        return rows["logit"].astype(np.float64)

    def _best_allowed(self, sampler: Any, ids: np.ndarray, logits: np.ndarray) -> int | None:
        """The allowed token of highest logit (None: none is allowed). The grammar is asked
        about the best ``FIRST`` first: when one of them is allowed, the best of those is
        the best of all (checking every token made most of a walk's time)."""
        if len(ids) > FIRST:
            best = np.argpartition(-logits, FIRST)[:FIRST]
            allowed = self._apply(sampler, ids[best], logits[best])
            if np.isfinite(allowed).any():
                return int(ids[best[int(np.argmax(allowed))]])
        allowed = self._apply(sampler, ids, logits)
        return int(ids[int(np.argmax(allowed))]) if np.isfinite(allowed).any() else None

    def walk(self, grammar: str, rng: np.random.Generator, max_steps: int = 300
             ) -> str | None:
        """One text the grammar allows (None: cut off at ``max_steps``)."""
        L = self.L
        sampler = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert sampler, "llama.cpp could not parse the grammar:\n" + grammar
        out = bytearray()
        try:
            for _ in range(max_steps):
                pick = None
                for ids, bias in ((self.short, self.bias["short"]), (self.all, self.bias["all"])):
                    pick = self._best_allowed(sampler, ids, rng.gumbel(size=len(ids)) + bias)
                    if pick is not None:
                        break
                assert pick is not None, "the grammar allows no token: " + out.decode(
                    errors="replace")
                if pick == self.eos:
                    return out.decode("utf-8", errors="replace")
                L.llama_sampler_accept(sampler, pick)
                out += self.pieces[pick]
            return None
        finally:
            L.llama_sampler_free(sampler)
