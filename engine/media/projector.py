"""The multimodal projector: llama.cpp's mtmd library on the loaded model.

``tokenize`` (thread-safe, runs on the API's prepare pool) decodes media bytes into
bitmaps and turns text and media parts into a ``MediaPrompt``: token ids where text is,
media tokens (``engine.media.spans``) where the media go, and one ``MediaSpan`` per media
chunk, holding mtmd's chunk until the engine thread ``encode``s it into embeddings.
The engine decodes those embeddings into the KV in its own batches
(``Runner.decode``); nothing here touches the llama context.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd_cpp
import numpy as np

from engine.config import MtmdConfig
from engine.media.spans import MediaSpan, media_tokens

log = logging.getLogger("llamaserve.mtmd")
L: Any = llama_cpp
M: Any = mtmd_cpp

_recent: collections.deque[str] = collections.deque(maxlen=8)  # last warnings and errors


def _mtmd_log(level: int, text: bytes | None, _user: Any) -> None:
    if not text:
        return
    line = text.decode("utf-8", "replace").rstrip()
    if level >= 3 and line:
        _recent.append(line)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", line)


_LOG_CALLBACK = L.llama_log_callback(_mtmd_log)


class ProjectorError(RuntimeError):
    """The projector cannot be used with this model (raised at start)."""


class MediaError(ValueError):
    """One media input of a request cannot be used; ``index`` says which (-1: all)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class MediaInput:
    kind: str  # "image" | "audio"
    data: bytes


@dataclass(frozen=True)
class MediaPrompt:
    tokens: list[int]
    media: tuple[MediaSpan, ...]


class _Chunk:
    """An owned mtmd input chunk, freed when the last span holding it lets go (the
    choices of one request share it)."""

    def __init__(self, ptr: Any) -> None:
        self.ptr = ptr
        weakref.finalize(self, M.mtmd_input_chunk_free, ptr)


def projector_identity(path: str) -> dict[str, Any]:
    """What encoded media depend on besides the bytes (cache keys): the projector file."""
    st = os.stat(path)
    return {"mmproj": os.path.basename(path), "size": st.st_size, "mtime": int(st.st_mtime)}


def projector_inputs(path: str) -> str:
    """What a projector file reads ("images and audio", …), from its metadata only."""
    M.mtmd_helper_log_set(_LOG_CALLBACK, None)
    caps = M.mtmd_get_cap_from_file(path.encode())
    kinds = [k for k, on in (("images", caps.inp_vision), ("audio", caps.inp_audio)) if on]
    return " and ".join(kinds) or "nothing this version knows"


class Projector:
    def __init__(self, path: str, model: Any, cfg: MtmdConfig, *, threads: int,
                 use_gpu: bool, n_ubatch: int) -> None:
        M.mtmd_helper_log_set(_LOG_CALLBACK, None)  # mtmd's and its helpers' logs
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        _recent.clear()
        ctx = M.mtmd_init_from_file(path.encode(), model, params)
        if not ctx:
            reason = "; ".join(_recent) or "see the log"
            raise ProjectorError(f"model.mtmd: llama.cpp could not load the projector {path} "
                                 f"for this model: {reason}")
        self.ctx = ctx
        # M-RoPE (Qwen-VL family): a media advances the position by mtmd_input_chunk_get_n_pos
        # and its rows carry four position components (engine.media.spans.PositionMap)
        self.mrope = bool(M.mtmd_decode_use_mrope(ctx))
        self.path = path
        self.cfg = cfg
        self.vision = bool(M.mtmd_support_vision(ctx))
        self.audio = bool(M.mtmd_support_audio(ctx))
        self.n_embd = int(L.llama_model_n_embd_inp(model))
        self.n_ubatch = n_ubatch
        self.identity = projector_identity(path)

    def close(self) -> None:
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None

    # -- prepare pool -----------------------------------------------------------------
    def tokenize(self, parts: Sequence[str | MediaInput], add_special: bool) -> MediaPrompt:
        """Text and media parts, in order, as one prompt. Raises MediaError naming the
        media that cannot be read."""
        bitmaps: list[Any] = []
        chunks = M.mtmd_input_chunks_init()
        keep: list[Any] = []
        try:
            c_parts = []
            for part in parts:
                p = M.mtmd_input_part()
                if isinstance(part, str):
                    raw = part.encode("utf-8")
                    text = M.mtmd_input_text(raw, len(raw), False, True)
                    keep.extend((raw, text))
                    p.text = ctypes.pointer(text)
                    p.bitmap = None
                else:
                    p.text = None
                    p.bitmap = self._bitmap(part, len(bitmaps))
                    bitmaps.append(p.bitmap)
                keep.append(p)
                c_parts.append(ctypes.pointer(p))
            array = (ctypes.POINTER(M.mtmd_input_part) * len(c_parts))(*c_parts)
            _recent.clear()
            if M.mtmd_tokenize_from_parts(self.ctx, chunks, array, len(c_parts),
                                          add_special) != 0:
                raise MediaError(-1, "the projector could not process the media: "
                                 + ("; ".join(_recent) or "unknown error"))
            return self._prompt(chunks)
        finally:
            M.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                M.mtmd_bitmap_free(b)

    def _bitmap(self, media: MediaInput, index: int) -> Any:
        if media.kind == "image" and not self.vision:
            raise MediaError(index, "this model's projector does not read images")
        if media.kind == "audio" and not self.audio:
            raise MediaError(index, "this model's projector does not read audio")
        buf = (ctypes.c_uint8 * len(media.data)).from_buffer_copy(media.data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(media.data), False)
        if not bitmap:
            raise MediaError(index, f"the {media.kind} could not be decoded (corrupt or an "
                             "unsupported format)")
        if bool(M.mtmd_bitmap_is_audio(bitmap)) != (media.kind == "audio"):
            M.mtmd_bitmap_free(bitmap)
            raise MediaError(index, "the data is not "
                             + ("an image" if media.kind == "image" else "audio"))
        return bitmap

    def _prompt(self, chunks: Any) -> MediaPrompt:
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        seen: collections.Counter[str] = collections.Counter()
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ptr[: n.value])
                continue
            n_tokens = int(M.mtmd_input_chunk_get_n_tokens(chunk))
            media_id = (M.mtmd_input_chunk_get_id(chunk) or b"").decode("ascii", "replace")
            # one media can become several chunks (image slices, 30 s audio windows)
            key = f"{media_id}.{seen[media_id]}"
            seen[media_id] += 1
            whole = bool(M.mtmd_decode_use_non_causal(self.ctx, chunk))
            if whole and n_tokens > self.n_ubatch:
                raise MediaError(-1, f"a media needs {n_tokens} positions in one micro-batch, "
                                 f"more than model.n_ubatch ({self.n_ubatch})")
            image = kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE
            grid = None
            if self.mrope and image:
                it = M.mtmd_input_chunk_get_tokens_image(chunk)
                grid = (int(M.mtmd_image_tokens_get_nx(it)), int(M.mtmd_image_tokens_get_ny(it)))
                if grid[0] * grid[1] != n_tokens:
                    raise MediaError(-1, f"the projector's image grid {grid} does not match "
                                     f"its {n_tokens} tokens")
            span = MediaSpan(start=len(tokens), n_tokens=n_tokens, key=key,
                             kind="image" if image else "audio",
                             chunk=_Chunk(M.mtmd_input_chunk_copy(chunk)), whole=whole,
                             n_pos=int(M.mtmd_input_chunk_get_n_pos(chunk)), grid=grid,
                             mrope=self.mrope)
            tokens.extend(media_tokens(key, n_tokens))
            spans.append(span)
        return MediaPrompt(tokens, tuple(spans))

    # -- engine thread -----------------------------------------------------------------
    def encode(self, span: MediaSpan) -> np.ndarray:
        """Run the encoder on one media chunk: (n_tokens, n_embd) float32."""
        if span.chunk is None:
            raise RuntimeError("media chunk already released")
        status = M.mtmd_encode_chunk(self.ctx, span.chunk.ptr)
        if status != 0:
            raise RuntimeError(f"mtmd_encode_chunk returned {status}")
        ptr = M.mtmd_get_output_embd(self.ctx)
        rows = np.ctypeslib.as_array(ptr, shape=(span.n_tokens * self.n_embd,))
        return rows.reshape(span.n_tokens, self.n_embd).copy()

    @staticmethod
    def release(span: MediaSpan) -> None:
        span.chunk = None
