"""An independent decode of text + images through the bindings and mtmd's own helper
(``mtmd_helper_eval_chunks``: llama.cpp's positions, batches and M-RoPE), greedy: what the
server's answer on the same prompt must equal (tests/test_mrope_server.py, bench/mrope.py).

    python tests/mrope_reference.py MODEL MMPROJ IMAGE "text before <__media__> text after"
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np

L: Any = llama_cpp
M: Any = mtmd
MARKER = "<__media__>"


@dataclass
class Chunk:
    kind: str  # "text" | "image"
    n_tokens: int
    n_pos: int
    grid: tuple[int, int] = (0, 0)  # (nx, ny) of an image


@dataclass
class Reference:
    chunks: list[Chunk] = field(default_factory=list)
    n_tokens: int = 0  # the prompt's KV cells (what usage counts)
    n_pos: int = 0  # the position after the prompt
    tokens: list[int] = field(default_factory=list)  # greedy answer
    text: str = ""
    uses_mrope: bool = False


def _quiet(level: int, text: bytes, user: Any) -> None:
    pass


_LOG = L.llama_log_callback(_quiet)


def greedy(model_path: str, mmproj: str, prompt: str, images: list[bytes], n_predict: int,
           *, n_ctx: int = 4096, n_batch: int = 512, threads: int = 1) -> Reference:
    """``prompt`` holds one MARKER per image. Evaluates it with mtmd_helper_eval_chunks in
    a fresh context, then decodes ``n_predict`` greedy tokens at the helper's positions."""
    L.llama_log_set(_LOG, None)
    M.mtmd_helper_log_set(_LOG, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    assert model, model_path
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    params = M.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = threads
    params.print_timings = False
    mctx = M.mtmd_init_from_file(mmproj.encode(), model, params)
    assert mctx, mmproj
    out = Reference(uses_mrope=bool(M.mtmd_decode_use_mrope(mctx)))
    chunks = M.mtmd_input_chunks_init()
    bitmaps = []
    try:
        for data in images:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmaps.append(M.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(data), False))
            assert bitmaps[-1]
        raw = prompt.encode()
        text = M.mtmd_input_text(raw, len(raw), True, True)
        arr = (M.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        assert M.mtmd_tokenize(mctx, chunks, ctypes.byref(text), arr, len(bitmaps)) == 0
        for i in range(M.mtmd_input_chunks_size(chunks)):
            c = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(c)
            ch = Chunk("text" if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT else "image",
                       int(M.mtmd_input_chunk_get_n_tokens(c)),
                       int(M.mtmd_input_chunk_get_n_pos(c)))
            if kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                it = M.mtmd_input_chunk_get_tokens_image(c)
                ch.grid = (int(M.mtmd_image_tokens_get_nx(it)), int(M.mtmd_image_tokens_get_ny(it)))
            out.chunks.append(ch)
        out.n_tokens = int(M.mtmd_helper_get_n_tokens(chunks))
        out.n_pos = int(M.mtmd_helper_get_n_pos(chunks))
        new_n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, n_batch, True,
                                         ctypes.byref(new_n_past)) == 0
        assert new_n_past.value == out.n_pos
        vocab = L.llama_model_get_vocab(model)
        n_vocab = int(L.llama_vocab_n_tokens(vocab))
        pos = new_n_past.value
        batch = L.llama_batch_init(1, 0, 1)
        try:
            for _ in range(n_predict):
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                tok = int(logits.argmax())
                if L.llama_vocab_is_eog(vocab, tok):
                    break
                out.tokens.append(tok)
                batch.n_tokens = 1
                batch.token[0], batch.pos[0], batch.n_seq_id[0] = tok, pos, 1
                batch.seq_id[0][0], batch.logits[0] = 0, 1
                assert L.llama_decode(ctx, batch) == 0
                pos += 1
        finally:
            L.llama_batch_free(batch)
        pieces = []
        for t in out.tokens:
            b = ctypes.create_string_buffer(256)
            n = L.llama_token_to_piece(vocab, t, b, 256, 0, False)
            pieces.append(b.raw[:n])
        out.text = b"".join(pieces).decode("utf-8", "replace")
        return out
    finally:
        for b in bitmaps:
            M.mtmd_bitmap_free(b)
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(mctx)
        L.llama_free(ctx)
        L.llama_model_free(model)


if __name__ == "__main__":
    model_path, mmproj_path, image, text = sys.argv[1:5]
    with open(image, "rb") as f:
        ref = greedy(model_path, mmproj_path, text, [f.read()], 16)
    print(ref)
