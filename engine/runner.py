"""The generation context: it owns the llama.cpp context (loaded through
``engine.loading``) and one reusable ``llama_batch`` whose arrays are numpy buffers,
decodes a scheduler plan in one ``llama_decode``, samples through per-request llama.cpp
sampler chains, and edits the KV memory (trim, copy, state save and restore) for the
prefix cache. Tokenizing is the model's ``vocabulary`` (``engine.vocabulary``).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from engine.backends.rpc import RpcBackend
from engine.backends.threadpool import attach as attach_threadpools
from engine.config import ModelConfig
from engine.embeddings.last_token import last_token_head
from engine.loading import (
    L,
    ModelLoadError,
    init_backend,
    kv_unified,
    library_version,
    load_model,
    new_context,
)
from engine.media.spans import MediaSpan, is_media_token, span_at
from engine.request import SamplingParams, TokenLogprob
from engine.sampling.grammar_check import GrammarChecker
from engine.sampling.samplers import Samplers
from engine.scheduler import BatchItem
from engine.vocabulary import Vocabulary

log = logging.getLogger("llamaserve.runner")

DECODE_NO_KV_SLOT = 1
# llama_state_seq_*_ext: only the partial state (a hybrid memory's recurrent part)
PARTIAL_ONLY = 1

class NumpyBatch:
    """A ``llama_batch`` whose arrays are numpy buffers: filling it is slice assignment,
    not a Python loop over ctypes fields. One sequence id per token. With ``n_embd``, it
    carries embedding rows (media) instead of token ids, and room for four positions per
    row (M-RoPE: llama.cpp reads ``pos[j * n_tokens + i]``, section-major)."""

    def __init__(self, n: int, n_embd: int = 0) -> None:
        self.tok = np.zeros(n, dtype=np.int32)
        self.embd = np.zeros((n, n_embd), dtype=np.float32) if n_embd else None
        self.pos = np.zeros(4 * n if n_embd else n, dtype=np.int32)
        self.nseq = np.ones(n, dtype=np.int32)
        self.seq = np.zeros(n, dtype=np.int32)
        self.out = np.zeros(n, dtype=np.int8)
        self.arange = np.arange(n, dtype=np.int32)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq.ctypes.data
        self._seq_ptrs = (i32p * n)(*[ctypes.cast(base + 4 * i, i32p) for i in range(n)])
        batch = L.llama_batch()
        if self.embd is None:
            batch.token = self.tok.ctypes.data_as(i32p)
            batch.embd = ctypes.POINTER(ctypes.c_float)()
        else:
            batch.token = i32p()
            batch.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        batch.pos = self.pos.ctypes.data_as(i32p)
        batch.n_seq_id = self.nseq.ctypes.data_as(i32p)
        batch.seq_id = self._seq_ptrs
        batch.logits = self.out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = batch


class Runner:
    def __init__(self, model_path: str, cfg: ModelConfig) -> None:
        init_backend()
        self._keep: list[Any] = []  # ctypes objects llama.cpp points into
        self.model_path = model_path
        self.cfg = cfg
        self.rpc: RpcBackend | None  # model.rpc_servers
        self.model, self.rpc = load_model(model_path, cfg, self._keep)
        self.vocabulary = Vocabulary(self.model)
        self.vocab = self.vocabulary.vocab
        self.n_vocab = self.vocabulary.n_vocab
        self.embedding_only = self._embedding_model(cfg)
        # a causal reranker scored without its LM head (engine/embeddings/last_token.py)
        self.rank_head = last_token_head(model_path, cfg.pooling_type) \
            if self.embedding_only else None
        self.ctx = new_context(self.model, cfg,
                               embeddings=self.embedding_only and self.rank_head is None,
                               eval_callback=self.rank_head and self.rank_head.callback)
        # one persistent CPU threadpool, as llama-server has (not one made per decode)
        self.threadpools = attach_threadpools(self.ctx, cfg.threads, cfg.n_threads_batch)
        self.mem = L.llama_get_memory(self.ctx)
        self.n_ctx = int(L.llama_n_ctx(self.ctx))
        self.n_ctx_seq = int(L.llama_n_ctx_seq(self.ctx))
        self.n_seq_max = int(L.llama_n_seq_max(self.ctx))
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.unified = kv_unified(cfg) or self.n_seq_max == 1
        # sliding-window attention keeps only the last window unless swa_full
        self.n_swa = 0 if cfg.swa_full else int(L.llama_model_n_swa(self.model))
        self._batch = NumpyBatch(self.n_batch)
        self._media_batch: NumpyBatch | None = None  # made on the first media decode
        self.media_identity: dict[str, Any] | None = None  # the projector (engine.media)
        self.adapters: dict[str, Any] = {}  # LoRA name -> llama_adapter_lora
        self._adapter_files: dict[str, dict[str, Any]] = {}
        self._applied: tuple[tuple[str, float], ...] = ()
        self.samplers = Samplers(self.vocab, self.n_vocab, self.ctx,
                                 backend=cfg.backend_sampling and cfg.draft_model is None)
        # a new grammar is parsed in a child process first (a parser crash costs a request)
        self.grammar_checker = GrammarChecker(model_path)
        if not self.embedding_only:
            self.grammar_checker.start()

    # -- loading --------------------------------------------------------------
    def _embedding_model(self, cfg: ModelConfig) -> bool:
        """An embedding-only model: bidirectional attention (BERT and kin) or a pooling type
        in the GGUF, unless the config says ``embedding: false``."""
        if cfg.embedding is False:
            return False
        meta = self.vocabulary.meta
        arch = meta("general.architecture") or ""
        causal = meta(f"{arch}.attention.causal")
        pooling = meta(f"{arch}.pooling_type")
        return causal == "false" or pooling not in (None, "0", "-1")

    def load_adapters(self, paths: dict[str, str]) -> None:
        """Load LoRA adapters (name -> GGUF path) on the model; a file llama.cpp refuses
        (another base model, not an adapter) is a start-up error naming it."""
        for name, path in paths.items():
            handle = L.llama_adapter_lora_init(self.model, path.encode())
            if not handle:
                raise ModelLoadError(f"model.loras: llama.cpp could not load the adapter "
                                     f"{name!r} ({path}) for this model")
            self.adapters[name] = handle
            st = os.stat(path)
            self._adapter_files[name] = {"file": os.path.basename(path), "size": st.st_size}

    def set_adapters(self, adapters: tuple[tuple[str, float], ...]) -> None:
        """Apply this LoRA set (name, scale) to the context, if it is not applied already."""
        if adapters == self._applied:
            return
        n = len(adapters)
        handles = (L.llama_adapter_lora_p_ctypes * n)(*[self.adapters[a] for a, _ in adapters])
        scales = (ctypes.c_float * n)(*[s for _, s in adapters])
        if L.llama_set_adapters_lora(self.ctx, handles if n else None, n,
                                     scales if n else None) != 0:
            raise RuntimeError("llama.cpp could not apply the LoRA adapters")
        self._applied = adapters

    @cached_property
    def recurrent(self) -> bool:
        """Recurrent or hybrid memory: rolling back a draft needs a kept snapshot."""
        return bool(L.llama_model_is_recurrent(self.model) or L.llama_model_is_hybrid(self.model))

    def kv_bytes(self) -> int:
        """About what the KV cache of this context takes (for the model registry's limits)."""
        n_layer = int(L.llama_model_n_layer(self.model))
        n_head = max(1, int(L.llama_model_n_head(self.model)))
        head_dim = int(L.llama_model_n_embd(self.model)) // n_head
        n_head_kv = int(L.llama_model_n_head_kv(self.model))
        per_element = {None: 2, "f16": 2, "bf16": 2, "f32": 4}
        k = per_element.get(self.cfg.type_k, 1)
        v = per_element.get(self.cfg.type_v, 1)
        return self.n_ctx * n_layer * n_head_kv * head_dim * (k + v)

    def close(self) -> None:
        self.samplers.close()
        self.grammar_checker.close()
        if self.rpc is not None and self.rpc.broken:
            # freeing buffers that live on a dead RPC server would wait on it for good
            self.ctx = self.model = None
            return
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.threadpools is not None:
            self.threadpools.free()
            self.threadpools = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    # -- sampling (engine.sampling) -------------------------------------------------
    def new_sampler(self, p: SamplingParams, history: Sequence[int], seq: int = -1) -> Any:
        return self.samplers.new(p, history, seq)

    def sample(self, sampler: Any, batch_index: int) -> int:
        return self.samplers.sample(sampler, batch_index)

    def accept(self, sampler: Any, token: int) -> None:
        self.samplers.accept(sampler, token)

    def forced(self, sampler: Any, most: int) -> list[int]:
        return self.samplers.forced(sampler, most)

    def take_forced(self, sampler: Any, token: int) -> bool:
        return self.samplers.take_forced(sampler, token)

    def free_sampler(self, sampler: Any) -> None:
        self.samplers.free(sampler)

    def check_grammar(self, p: SamplingParams) -> None:
        """Raise ValueError if llama.cpp cannot parse the request's grammar, crashes or
        hangs on it: asked of a child process (``engine.sampling.grammar_check``), so that
        the engine only ever parses grammars known to parse. Safe on a worker thread."""
        assert p.grammar is not None
        self.grammar_checker.check(p.grammar, p.grammar_triggers)
        if self.samplers.masks is not None:
            self.samplers.masks.prepare(p.grammar)

    def logprob(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        ptr = L.llama_get_logits_ith(self.ctx, batch_index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        peak = float(logits.max())
        lse = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
        top: tuple[tuple[int, float], ...] = ()
        if top_n > 0:
            idx = np.argpartition(-logits, top_n)[:top_n]
            idx = idx[np.argsort(-logits[idx], kind="stable")]
            top = tuple((int(i), float(logits[i]) - lse) for i in idx)
        return TokenLogprob(token, float(logits[token]) - lse, top)

    # -- decoding -----------------------------------------------------------------
    def decode(self, items: Sequence[BatchItem]) -> tuple[int, list[int]]:
        """Decode all items: media chunks first (their embedding rows, in one batch), then
        every token item in one llama_decode. Returns (status, batch index of each item's
        last token; -1 for media). Items that want prompt logprobs get logits everywhere."""
        media = [i for i in items if i.tokens and is_media_token(i.tokens[0])]
        if media:
            status = self._decode_media(media)
            if status != 0:
                return status, []
            if len(media) == len(items):
                return 0, [-1] * len(items)
            text = [i for i in items if not (i.tokens and is_media_token(i.tokens[0]))]
            status, last_text = self._decode_tokens(text)
            it = iter(last_text)
            return status, [-1 if i.tokens and is_media_token(i.tokens[0]) else next(it)
                            for i in items]
        return self._decode_tokens(items)

    def _decode_media(self, items: Sequence[BatchItem]) -> int:
        """Feed media embeddings. A media evaluated whole (non-causal attention inside it)
        gets a llama_decode of its own with causal attention off."""
        if self._media_batch is None:
            self._media_batch = NumpyBatch(self.n_batch,
                                           int(L.llama_model_n_embd_inp(self.model)))
        b = self._media_batch
        assert b.embd is not None
        together: list[tuple[BatchItem, MediaSpan]] = []
        groups: list[tuple[bool, list[tuple[BatchItem, MediaSpan]]]] = [(False, together)]
        for item in items:
            span = span_at(item.request.media, item.pos)
            assert span is not None and span.embd is not None
            if span.whole:
                groups.append((True, [(item, span)]))
            else:
                together.append((item, span))
        for whole, group in groups:
            if not group:
                continue
            n = 0
            mrope = any(span.mrope for _, span in group)
            sections = []
            for item, span in group:
                assert span.embd is not None
                k, first = len(item.tokens), item.pos - span.start
                b.embd[n : n + k] = span.embd[first : first + k]
                p0 = item.request.positions.next(span.start)
                if mrope:  # as mtmd_helper_decode_image_chunk sets them
                    sections.append(span.row_positions(first, k, p0))
                else:
                    b.pos[n : n + k] = b.arange[:k] + p0 + first
                b.seq[n : n + k] = item.request.seq_id
                b.out[n : n + k] = 0
                n += k
            if mrope:
                b.pos[: 4 * n] = np.concatenate(sections, axis=1).ravel()
            b.batch.n_tokens = n
            if whole:
                L.llama_set_causal_attn(self.ctx, False)
            try:
                status = int(L.llama_decode(self.ctx, b.batch))
            finally:
                if whole:
                    L.llama_set_causal_attn(self.ctx, True)
            if status != 0:
                return status
        return 0

    def _decode_tokens(self, items: Sequence[BatchItem]) -> tuple[int, list[int]]:
        b = self._batch
        tok, pos, seq, out = b.tok, b.pos, b.seq, b.out
        n = 0
        last: list[int] = []
        for item in items:
            k = len(item.tokens)
            sid = item.request.seq_id
            # text: one position per token, after the media before it (engine.media.spans)
            at = item.request.positions.next(item.pos)
            if k == 1:
                tok[n] = item.tokens[0]
                pos[n] = at
                seq[n] = sid
                out[n] = item.logits
            else:
                tok[n : n + k] = item.tokens
                pos[n : n + k] = b.arange[:k] + at
                seq[n : n + k] = sid
                every = item.request.params.prompt_logprobs or (
                    item.n_draft > 0 and not item.request.forced_unsampled)
                out[n : n + k] = every
                out[n + k - 1] = item.logits or every
            n += k
            last.append(n - 1)
        b.batch.n_tokens = n
        if self.samplers.backend is not None:
            self.samplers.backend.arrange(items)
        status = int(L.llama_decode(self.ctx, b.batch))
        return status, last

    def decode_tokens(self, entries: Sequence[tuple[int, Sequence[int], int]]
                      ) -> tuple[int, list[int]]:
        """Decode (seq, tokens, first position) entries in one batch, logits at each
        entry's last token (the draft model's path). Returns (status, last indices)."""
        b = self._batch
        n = 0
        last = []
        for seq, tokens, pos in entries:
            k = len(tokens)
            b.tok[n : n + k] = tokens
            b.pos[n : n + k] = b.arange[:k] + pos
            b.seq[n : n + k] = seq
            b.out[n : n + k] = 0
            b.out[n + k - 1] = 1
            n += k
            last.append(n - 1)
        b.batch.n_tokens = n
        return int(L.llama_decode(self.ctx, b.batch)), last

    def argmax(self, batch_index: int, ctx: Any = None) -> tuple[int, float]:
        """The most likely next token at ``batch_index`` of the last decode (in this
        runner's context, or ``ctx`` on the same model) and its probability."""
        ptr = L.llama_get_logits_ith(ctx or self.ctx, batch_index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        token = int(logits.argmax())
        peak = float(logits[token])
        return token, 1.0 / float(np.exp(logits - peak, dtype=np.float64).sum())

    # -- sequences (engine.caches.prefix_cache.KvOps) ----------------------------------------
    def seq_clear(self, seq: int) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_trim(self, seq: int, keep: int) -> bool:
        return bool(L.llama_memory_seq_rm(self.mem, seq, keep, -1))

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        if self.unified:  # cells are shared, nothing is copied
            L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
            return True
        # one stream per sequence: llama.cpp copies whole streams only
        L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        return self.seq_trim(dst, n)

    def seq_pos_min(self, seq: int) -> int:
        return int(L.llama_memory_seq_pos_min(self.mem, seq))

    def state_size(self, seq: int) -> int:
        return int(L.llama_state_seq_get_size(self.ctx, seq))

    def state_get(self, seq: int) -> bytearray:
        size = self.state_size(seq)
        data = bytearray(size)
        n = int(L.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq))
        del data[n:]
        return data

    def state_set(self, seq: int, data: bytearray) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return int(L.llama_state_seq_set_data(self.ctx, buf, len(data), seq)) > 0

    def state_get_partial(self, seq: int) -> bytes:
        """The part of a sequence's state that cannot be cut back (PARTIAL_ONLY): the
        recurrent state of a hybrid / recurrent model, the window layers of a
        sliding-window one (``swa_full: false``); the full attention KV is left out. A
        snapshot ``seq_rewind`` restores."""
        size = int(L.llama_state_seq_get_size_ext(self.ctx, seq, PARTIAL_ONLY))
        if size <= 0:
            raise RuntimeError(f"llama.cpp has no partial state for sequence {seq}")
        buf = (ctypes.c_uint8 * size)()
        n = int(L.llama_state_seq_get_data_ext(self.ctx, buf, size, seq, PARTIAL_ONLY))
        if n <= 0:
            raise RuntimeError(f"llama.cpp could not copy the partial state of sequence {seq}")
        return ctypes.string_at(buf, n)

    def seq_rewind(self, seq: int, n: int, data: bytes, src: int | None = None,
                   last: int | None = None) -> bool:
        """``seq`` := its own (or ``src``'s) positions below ``n``, with the partial state
        ``data`` taken when the sequence was there: the snapshot replaces the recurrent
        part (or the window), then the attention KV is cut at ``n``. False (``seq`` then
        holds something unknown: the caller clears it) when llama.cpp refuses the data or
        the restored state is not at ``last`` (the highest position kept: ``n - 1``, or an M-RoPE
        media's own position when the snapshot follows one)."""
        if src is not None:
            if self.unified:
                L.llama_memory_seq_cp(self.mem, src, seq, 0, n)
            elif self.n_swa > 0:
                # one stream per sequence: llama.cpp copies a stream's buffers at the next
                # decode, over the window restored below; so the state goes through the host
                if not self.state_set(seq, self.state_get(src)):
                    return False
            else:  # one stream per sequence: whole streams only, cut below
                L.llama_memory_seq_cp(self.mem, src, seq, -1, -1)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if int(L.llama_state_seq_set_data_ext(self.ctx, buf, len(data), seq, PARTIAL_ONLY)) <= 0:
            return False
        # a hybrid memory's last position is the smaller of the attention's and the state's
        if int(L.llama_memory_seq_pos_max(self.mem, seq)) != (n - 1 if last is None else last):
            return False
        return self.seq_trim(seq, n)

    def state_layout(self) -> dict[str, Any]:
        """What a saved sequence state depends on besides the model file (for the disk
        cache's compatibility key)."""
        c = self.cfg
        return {"llama_cpp": library_version(), "type_k": c.type_k, "type_v": c.type_v,
                "n_ctx": self.n_ctx, "n_ctx_seq": self.n_ctx_seq,
                "kv_unified": kv_unified(c),
                "swa_full": c.swa_full, "flash_attn": c.flash_attn,
                "loras": [[x.name, x.scale, self._adapter_files.get(x.name)] for x in c.loras
                          if x.scale != 0],
                "mmproj": self.media_identity}
