"""The llama.cpp side of MTP drafting (``engine.drafts.mtp.MtpBackend``): an MTP context over
the target model, fed through llama.cpp's extended batch (a token plus the hidden row
it is paired with) and ``llama_process``."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from engine.config import ModelConfig
from engine.drafts.mtp import NextnApi, Row
from engine.loading import L, ModelLoadError, new_context
from engine.runner import Runner


def mtp_layers(runner: Runner) -> int:
    return int(L.llama_model_n_layer_nextn(runner.model))


class LlamaMtp:
    def __init__(self, runner: Runner, cfg: ModelConfig) -> None:
        api = NextnApi.load(L.llama_cpp._lib)
        if api is None:
            raise ModelLoadError("draft_model 'draft-mtp': this llama.cpp build exports no "
                                 "llama_set_embeddings_nextn / llama_get_embeddings_nextn")
        self.api, self.target = api, runner
        self.n_embd = int(L.llama_model_n_embd_out(runner.model))
        self.ctx = new_context(runner.model, cfg, mtp_of=runner.ctx)
        self.mem = L.llama_get_memory(self.ctx)
        api.set(runner.ctx, True, False)  # the target: a hidden row for every token
        api.set(self.ctx, True, True)  # the MTP head: rows for the outputs only
        self.batch = L.llama_batch_ext_init(self.ctx)
        self._pos = ctypes.c_int32(0)

    def close(self) -> None:
        self.api.set(self.target.ctx, False, False)
        L.llama_batch_ext_free(self.batch)
        L.llama_free(self.ctx)

    def target_rows(self, n_tokens: int) -> Row:
        ptr = self.api.get(self.target.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_tokens, self.n_embd))

    def process(self, entries: Sequence[tuple[int, int, int, Row, bool]]) -> int:
        b = self.batch
        L.llama_batch_ext_clear(b)
        keep = []
        for seq, token, pos, row, out in entries:
            idx = L.llama_batch_ext_add_token(b, seq, token)
            if idx < 0:
                return -1
            self._pos.value = pos
            L.llama_batch_ext_set_pos(b, idx, ctypes.byref(self._pos))
            row = np.ascontiguousarray(row, dtype=np.float32)
            keep.append(row)
            embd = L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1,
                                self.n_embd)
            if not L.llama_batch_ext_set_embd_token(b, idx, embd):
                return -1
            L.llama_batch_ext_set_output_logits(b, idx, out)
        return int(L.llama_process(self.ctx, L.LLAMA_PROCESS_TYPE_DECODE, b))

    def top1(self, index: int, with_p: bool = True) -> tuple[int, float]:
        if with_p:
            return self.target.argmax(index, self.ctx)
        ptr = L.llama_get_logits_ith(self.ctx, index)
        return int(np.ctypeslib.as_array(ptr, shape=(self.target.n_vocab,)).argmax()), 1.0

    def row(self, index: int) -> Row:
        ptr = self.api.get_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def seq_trim(self, seq: int, keep: int) -> None:
        if not L.llama_memory_seq_rm(self.mem, seq, keep, -1):
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_clear(self, seq: int) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_end(self, seq: int) -> int:
        return int(L.llama_memory_seq_pos_max(self.mem, seq)) + 1


