"""Loading llama.cpp: the backend (once per process, its log into Python's), a model's
weights placed as the config says, and contexts on them. ``llamaserve check`` reads a
file's summary here without its weights."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import llama_cpp

from engine.backends.rpc import RpcBackend, RpcError
from engine.backends.rpc import log as rpc_log
from engine.config import ModelConfig

log = logging.getLogger("llamaserve.runner")
# The bindings' ctypes annotations are stricter than ctypes itself; the engine's modules
# that call llama.cpp use the C API untyped.
L: Any = llama_cpp

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
            "iq4_nl": 20, "bf16": 30}

_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def _llama_log(level: int, text: bytes | None, _user: Any) -> None:
    py_level = _LOG_LEVELS.get(level, logging.DEBUG)
    if text and log.isEnabledFor(py_level):
        log.log(py_level, text.decode("utf-8", "replace").rstrip())


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
    _llama_log)
_backend_ready = False


def init_backend() -> None:
    """llama.cpp's backends, once per process, its log going to Python's logging
    (``llamaserve.runner``)."""
    global _backend_ready
    if not _backend_ready:
        L.llama_log_set(_LOG_CALLBACK, None)
        L.llama_backend_init()
        _backend_ready = True


def library_version() -> str:
    return str(getattr(L, "__version__", "unknown"))


class ModelLoadError(RuntimeError):
    pass


def model_summary(path: str) -> dict[str, str]:
    """What ``llamaserve check`` reports of a model file: llama.cpp reads its metadata and
    vocabulary (no weights). Raises ModelLoadError if llama.cpp cannot."""
    init_backend()
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



def load_model(path: str, cfg: ModelConfig, keep: list[Any]) -> tuple[Any, RpcBackend | None]:
    """The model's weights, placed as the config says (GPU layers, tensor split, RPC
    servers); ``keep`` holds the ctypes arrays llama.cpp points into. Returns the model and
    its RPC backend (None without ``model.rpc_servers``)."""
    rpc: RpcBackend | None = None
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
        keep.append(split)
        mp.tensor_split = split
    if cfg.rpc_servers:
        try:
            rpc = RpcBackend.connect(cfg.rpc_servers)
        except RpcError as exc:
            raise ModelLoadError(str(exc)) from None
        devices = rpc.device_array()
        keep.append(devices)
        mp.devices = ctypes.cast(devices, ctypes.c_void_p)
        rpc_log.info("devices: %s (n_gpu_layers %s)", rpc.describe(),
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
    return model, rpc


def kv_unified(cfg: ModelConfig) -> bool:
    """Whether a context's sequences share one KV pool: as configured, and unset they do.
    In one pool any sequence may use all of ``n_ctx`` (the config's promise: ``n_ctx`` is
    the context one request may use, as vLLM's ``max_model_len``) and copied prefixes
    share cells; ``kv_unified: false`` splits ``n_ctx`` evenly per sequence, as
    llama-server does with ``-np N``: each token then attends over its own sequence's cells
    only, which pays with many short sequences, but a request may use only its share.
    (Split above four sequences by default refused a 2k prompt in an 8k / 16-sequence
    config and ran Gemma 3 at 16 streams at two thirds of one pool's speed: issue 48.)"""
    return cfg.kv_unified is not False


def new_context(model: Any, cfg: ModelConfig, *, embeddings: bool = False,
                n_ctx: int | None = None, n_seq_max: int | None = None,
                mtp_of: Any = None, eval_callback: Any = None) -> Any:
    """A context on a loaded model. Embedding contexts evaluate a whole batch in one
    micro-batch (bidirectional attention needs each sequence in one piece); ``mtp_of``
    makes an MTP context drafting for that target context. ``eval_callback`` (ggml's
    ``ggml_backend_sched_eval_callback``, kept alive by the caller) sees the graph's nodes:
    such a context scores whole batches like an embedding context (one micro-batch, one
    KV pool), from the outputs the batch asks for (``engine/embeddings/last_token.py``)."""
    whole = embeddings or eval_callback is not None
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
    cp.n_ubatch = cp.n_batch if whole else min(cfg.n_ubatch, cfg.n_batch)
    cp.n_seq_max = n_seq_max or cfg.n_seq_max
    cp.n_threads = cfg.threads
    cp.n_threads_batch = cfg.n_threads_batch
    # a scoring context reads its outputs in batch order, which only one KV pool keeps
    # (split pools cut a batch into equal-length pieces, reordering the sequences)
    cp.kv_unified = eval_callback is not None or kv_unified(cfg)
    cp.swa_full = cfg.swa_full
    if cfg.backend_sampling and not cfg.draft_max_tokens and not embeddings:
        # a sequence llama.cpp samples has one output a step (as llama-server sets it
        # without drafts): smaller sampling graphs; others are not limited by this
        cp.n_outputs_max_per_seq = 1
    cp.no_perf = True
    cp.embeddings = embeddings
    if eval_callback is not None:
        cp.cb_eval = eval_callback
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
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise ModelLoadError("llama.cpp could not create a context with these settings")
    return ctx
