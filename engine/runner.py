"""The only module that talks to llama.cpp.

It loads the model, owns the context and one reusable ``llama_batch`` whose
arrays are numpy buffers, decodes a scheduler plan in one ``llama_decode``,
samples through per-request llama.cpp sampler chains, and tokenizes /
detokenizes. Tokenizer calls only read the vocabulary, so they are safe from
worker threads while the engine thread decodes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from engine.backends.rpc import RpcBackend, RpcError
from engine.backends.rpc import log as rpc_log
from engine.backends.threadpool import attach as attach_threadpools
from engine.config import ModelConfig
from engine.media.spans import MediaSpan, is_media_token, span_at
from engine.request import SamplingParams, TokenLogprob
from engine.sampling.grammar_check import GrammarChecker
from engine.sampling.samplers import Samplers
from engine.scheduler import BatchItem

log = logging.getLogger("llamaserve.runner")
# The bindings' ctypes annotations are stricter than ctypes itself; this module is the
# typed boundary, so the C API is used untyped here.
L: Any = llama_cpp

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
            "iq4_nl": 20, "bf16": 30}
DECODE_NO_KV_SLOT = 1
# llama_state_seq_*_ext: only the partial state (a hybrid memory's recurrent part)
PARTIAL_ONLY = 1

_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def _llama_log(level: int, text: bytes | None, _user: Any) -> None:
    py_level = _LOG_LEVELS.get(level, logging.DEBUG)
    if text and log.isEnabledFor(py_level):
        log.log(py_level, text.decode("utf-8", "replace").rstrip())


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
    _llama_log)
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        L.llama_log_set(_LOG_CALLBACK, None)
        L.llama_backend_init()
        _backend_ready = True


def library_version() -> str:
    return str(getattr(L, "__version__", "unknown"))


@dataclass(frozen=True)
class FimTokens:
    """Fill-in-the-middle markers: prefix, suffix, middle; repository and file separators
    where the model was trained on repository-level FIM."""

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None


def model_summary(path: str) -> dict[str, str]:
    """What ``llamaserve check`` reports of a model file: llama.cpp reads its metadata and
    vocabulary (no weights). Raises ModelLoadError if llama.cpp cannot."""
    _init_backend()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load the model file {path}")
    try:
        buf = ctypes.create_string_buffer(256)
        out = {}
        for key in ("general.architecture", "general.name", "general.size_label"):
            if L.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) >= 0:
                out[key.split(".")[1]] = buf.value.decode("utf-8", "replace")
        vocab = L.llama_model_get_vocab(model)
        out["vocabulary"] = str(L.llama_vocab_n_tokens(vocab))
        out["chat template"] = "yes" if L.llama_model_chat_template(model, None) else "no"
        fim = L.llama_vocab_fim_pre(vocab) >= 0 and L.llama_vocab_fim_mid(vocab) >= 0
        out["fill-in-the-middle"] = "yes" if fim else "no"
        return out
    finally:
        L.llama_model_free(model)


class ModelLoadError(RuntimeError):
    pass


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
        _init_backend()
        self._keep: list[Any] = []  # ctypes objects llama.cpp points into
        self.model_path = model_path
        self.cfg = cfg
        self.rpc: RpcBackend | None = None  # model.rpc_servers
        self.model = self._load_model(model_path, cfg)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.embedding_only = self._embedding_model(cfg)
        self.ctx = self.new_context(cfg, embeddings=self.embedding_only)
        # one persistent CPU threadpool, as llama-server has (not one made per decode)
        self.threadpools = attach_threadpools(self.ctx, cfg.threads, cfg.n_threads_batch)
        self.mem = L.llama_get_memory(self.ctx)
        self.n_ctx = int(L.llama_n_ctx(self.ctx))
        self.n_ctx_seq = int(L.llama_n_ctx_seq(self.ctx))
        self.n_seq_max = int(L.llama_n_seq_max(self.ctx))
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.unified = cfg.kv_unified or self.n_seq_max == 1
        # sliding-window attention keeps only the last window unless swa_full
        self.n_swa = 0 if cfg.swa_full else int(L.llama_model_n_swa(self.model))
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})
        self._eog: dict[int, bool] = {}
        self._batch = NumpyBatch(self.n_batch)
        self._media_batch: NumpyBatch | None = None  # made on the first media decode
        self.media_identity: dict[str, Any] | None = None  # the projector (engine.media)
        self.adapters: dict[str, Any] = {}  # LoRA name -> llama_adapter_lora
        self._adapter_files: dict[str, dict[str, Any]] = {}
        self._applied: tuple[tuple[str, float], ...] = ()
        self.samplers = Samplers(self.vocab, self.n_vocab, self.ctx)
        # a new grammar is parsed in a child process first (a parser crash costs a request)
        self.grammar_checker = GrammarChecker(model_path)
        if not self.embedding_only:
            self.grammar_checker.start()

    # -- loading --------------------------------------------------------------
    def _load_model(self, path: str, cfg: ModelConfig) -> Any:
        mp = L.llama_model_default_params()
        if cfg.n_gpu_layers is not None:
            mp.n_gpu_layers = cfg.n_gpu_layers
        if cfg.split_mode is not None:
            mp.split_mode = cfg.split_mode
        if cfg.main_gpu is not None:
            mp.main_gpu = cfg.main_gpu
        if cfg.tensor_split:  # llama.cpp reads one value per device
            n = max(len(cfg.tensor_split), int(L.llama_max_devices()))
            split = (ctypes.c_float * n)(*cfg.tensor_split)
            self._keep.append(split)
            mp.tensor_split = split
        if cfg.rpc_servers:
            try:
                self.rpc = RpcBackend.connect(cfg.rpc_servers)
            except RpcError as exc:
                raise ModelLoadError(str(exc)) from None
            devices = self.rpc.device_array()
            self._keep.append(devices)
            mp.devices = ctypes.cast(devices, ctypes.c_void_p)
            rpc_log.info("devices: %s (n_gpu_layers %s)", self.rpc.describe(),
                     "all" if cfg.n_gpu_layers in (None, -1) else cfg.n_gpu_layers)
        if cfg.draft_model == "draft-mtp":
            mp.load_mtp = True  # the MTP layers, for an MTP context (engine.drafts.mtp_runner)
        if cfg.use_mmap and cfg.use_mlock:
            mp.load_mode = L.LLAMA_LOAD_MODE_MMAP_MLOCK
        elif cfg.use_mlock:
            mp.load_mode = L.LLAMA_LOAD_MODE_MLOCK
        elif cfg.use_mmap:
            mp.load_mode = L.LLAMA_LOAD_MODE_MMAP
        else:
            mp.load_mode = L.LLAMA_LOAD_MODE_NONE
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise ModelLoadError(f"llama.cpp could not load the model file {path}")
        return model

    def _embedding_model(self, cfg: ModelConfig) -> bool:
        """An embedding-only model: bidirectional attention (BERT and kin) or a pooling type
        in the GGUF, unless the config says ``embedding: false``."""
        if cfg.embedding is False:
            return False
        arch = self.meta("general.architecture") or ""
        causal = self.meta(f"{arch}.attention.causal")
        pooling = self.meta(f"{arch}.pooling_type")
        return causal == "false" or pooling not in (None, "0", "-1")

    def new_context(self, cfg: ModelConfig, *, embeddings: bool = False, n_ctx: int | None = None,
                    n_seq_max: int | None = None, mtp_of: Any = None) -> Any:
        """A context on the loaded model. Embedding contexts evaluate a whole batch in one
        micro-batch (bidirectional attention needs each sequence in one piece); ``mtp_of``
        makes an MTP context drafting for that target context."""
        cp = L.llama_context_default_params()
        if mtp_of is not None:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
            cp.ctx_other = mtp_of
            cp.n_rs_seq = 0
        elif not embeddings and cfg.draft_max_tokens:
            # recurrent state (hybrid models) can only roll back rejected drafts from this
            # many kept snapshots per sequence
            cp.n_rs_seq = cfg.draft_max_tokens
        cp.n_ctx = n_ctx or cfg.n_ctx
        cp.n_batch = min(cfg.n_batch, cp.n_ctx)
        cp.n_ubatch = cp.n_batch if embeddings else min(cfg.n_ubatch, cfg.n_batch)
        cp.n_seq_max = n_seq_max or cfg.n_seq_max
        cp.n_threads = cfg.threads
        cp.n_threads_batch = cfg.n_threads_batch
        cp.kv_unified = cfg.kv_unified
        cp.swa_full = cfg.swa_full
        cp.no_perf = True
        cp.embeddings = embeddings
        if embeddings and cfg.pooling_type is not None:
            cp.pooling_type = cfg.pooling_type
        if cfg.flash_attn is not None:
            cp.flash_attn_type = {True: 1, False: 0, "auto": -1}[cfg.flash_attn]
        if cfg.offload_kqv is not None:
            cp.offload_kqv = cfg.offload_kqv
        if cfg.op_offload is not None:
            cp.op_offload = cfg.op_offload
        if cfg.type_k is not None:
            cp.type_k = KV_TYPES[cfg.type_k]
        if cfg.type_v is not None:
            cp.type_v = KV_TYPES[cfg.type_v]
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise ModelLoadError("llama.cpp could not create a context with these settings")
        return ctx

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

    @property
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

    # -- metadata ---------------------------------------------------------------
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

    # -- sampling (engine.sampling) -------------------------------------------------
    def new_sampler(self, p: SamplingParams, history: Sequence[int]) -> Any:
        return self.samplers.new(p, history)

    def sample(self, sampler: Any, batch_index: int) -> int:
        return self.samplers.sample(sampler, batch_index)

    def free_sampler(self, sampler: Any) -> None:
        self.samplers.free(sampler)

    def check_grammar(self, p: SamplingParams) -> None:
        """Raise ValueError if llama.cpp cannot parse the request's grammar, crashes or
        hangs on it: asked of a child process (``engine.sampling.grammar_check``), so that
        the engine only ever parses grammars known to parse. Safe on a worker thread."""
        assert p.grammar is not None
        self.grammar_checker.check(p.grammar, p.grammar_triggers)

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
                every = item.request.params.prompt_logprobs or item.n_draft > 0
                out[n : n + k] = every
                out[n + k - 1] = item.logits or every
            n += k
            last.append(n - 1)
        b.batch.n_tokens = n
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

    def state_get(self, seq: int) -> bytearray:
        size = int(L.llama_state_seq_get_size(self.ctx, seq))
        data = bytearray(size)
        n = int(L.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq))
        del data[n:]
        return data

    def state_set(self, seq: int, data: bytearray) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return int(L.llama_state_seq_set_data(self.ctx, buf, len(data), seq)) > 0

    def state_get_partial(self, seq: int) -> bytes:
        """The recurrent part of a hybrid / recurrent sequence's state (PARTIAL_ONLY: the
        attention KV is left out), a snapshot ``seq_rewind`` restores."""
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
        """``seq`` := its own (or ``src``'s) positions below ``n``, with the recurrent state
        ``data`` taken when the sequence was there: the snapshot replaces the recurrent
        part, then the attention KV is cut at ``n``. False (``seq`` then holds something
        unknown: the caller clears it) when llama.cpp refuses the data or the restored
        state is not at ``last`` (the highest position kept: ``n - 1``, or an M-RoPE
        media's own position when the snapshot follows one)."""
        if src is not None:
            if self.unified:
                L.llama_memory_seq_cp(self.mem, src, seq, 0, n)
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
                "n_ctx": self.n_ctx, "n_ctx_seq": self.n_ctx_seq, "kv_unified": c.kv_unified,
                "swa_full": c.swa_full, "flash_attn": c.flash_attn,
                "loras": [[x.name, x.scale, self._adapter_files.get(x.name)] for x in c.loras
                          if x.scale != 0],
                "mmproj": self.media_identity}
