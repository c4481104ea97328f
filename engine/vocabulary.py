"""A model's vocabulary and metadata: tokenizing, token pieces, special and FIM tokens,
end-of-generation tokens, the chat template and the GGUF's key/values. Every call only
reads the loaded model, so it is safe from worker threads while the engine thread decodes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.loading import L


@dataclass(frozen=True)
class FimTokens:
    """Fill-in-the-middle markers: prefix, suffix, middle; repository and file separators
    where the model was trained on repository-level FIM."""

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None


class Vocabulary:
    """The vocabulary of a loaded model (``Runner.vocabulary``)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)  # llama.cpp's pointer
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})
        self._eog: dict[int, bool] = {}

    # -- the GGUF's metadata ------------------------------------------------------
    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8") if raw else None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def metadata(self) -> dict[str, str]:
        """The GGUF's scalar and string metadata as llama.cpp keeps it (arrays such as the
        vocabulary are not kept), plus ``general.parameter_count``."""
        out: dict[str, str] = {}
        for i in range(L.llama_model_meta_count(self.model)):
            key = ctypes.create_string_buffer(256)
            if L.llama_model_meta_key_by_index(self.model, i, key, len(key)) < 0:
                continue
            value = ctypes.create_string_buffer(1024)
            n = L.llama_model_meta_val_str_by_index(self.model, i, value, len(value))
            if n >= len(value):  # a long string (a chat template): read it whole
                value = ctypes.create_string_buffer(n + 1)
                n = L.llama_model_meta_val_str_by_index(self.model, i, value, len(value))
            if n >= 0:
                out[key.value.decode("utf-8", "replace")] = value.value.decode("utf-8",
                                                                               "replace")
        out["general.parameter_count"] = str(L.llama_model_n_params(self.model))
        return out

    def special_token_text(self, which: str) -> str:
        token = {"bos": L.llama_vocab_bos, "eos": L.llama_vocab_eos}[which](self.vocab)
        return self.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    @property
    def bos_token(self) -> int:
        return int(L.llama_vocab_bos(self.vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(L.llama_vocab_get_add_bos(self.vocab))

    def fim_tokens(self) -> FimTokens | None:
        """The vocabulary's fill-in-the-middle tokens (None: the model has none)."""
        ids = [int(f(self.vocab)) for f in (L.llama_vocab_fim_pre, L.llama_vocab_fim_suf,
                                            L.llama_vocab_fim_mid, L.llama_vocab_fim_rep,
                                            L.llama_vocab_fim_sep)]
        if min(ids[:3]) < 0:
            return None
        return FimTokens(ids[0], ids[1], ids[2], ids[3] if ids[3] >= 0 else None,
                         ids[4] if ids[4] >= 0 else None)

    # -- tokenizer (thread-safe: reads the vocabulary only) -----------------------
    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        cache = self._pieces[special]
        out = cache.get(token)
        if out is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            out = buf.raw[:n]
            cache[token] = out
        return out

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab

    def is_eog(self, token: int) -> bool:
        hit = self._eog.get(token)
        if hit is None:
            hit = bool(L.llama_vocab_is_eog(self.vocab, token))
            self._eog[token] = hit
        return hit
