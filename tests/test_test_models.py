"""The random test models of tests/make_test_models.py load in llama.cpp itself.

Through the low-level bindings only (no server): the vision projector goes through
mtmd (init with the real Qwen model, tokenize text + one image, encode the image chunk,
evaluate the chunks into a llama context, or feed its embeddings by hand as an engine
would), the audio encoder too (alone or next to vision), a projector of the wrong width
and media the projector cannot take are refused, and the LoRA adapters load and change
greedy output at scale 1 but not at scale 0. These calls are the reference for building
multimodal input and LoRA into the engine.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest
from make_test_models import (
    AudioSpec,
    ProjectorSpec,
    read_base_model,
    write_lora_adapter,
    write_projector,
    write_vision_projector,
)

from conftest import require_model

L: Any = llama_cpp
M: Any = mtmd

PROMPT = "def fibonacci(n):"
N_GREEDY = 8
THREADS = 1  # the machine is shared; one thread avoids spinning against others


@pytest.fixture(scope="module")
def qwen_path() -> str:
    return require_model("qwen-0.5b")


@pytest.fixture(scope="module")
def model(qwen_path: str) -> Iterator[Any]:
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    m = L.llama_model_load_from_file(qwen_path.encode(), params)
    assert m, "Qwen model failed to load"
    yield m
    L.llama_model_free(m)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("test-models")


@pytest.fixture(scope="module")
def n_embd(qwen_path: str) -> int:
    return read_base_model(qwen_path).n_embd


class MtmdLog:
    """Captures mtmd's (clip's) log lines, so a refusal's reason can be read."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cb = L.llama_log_callback(self._log)  # keep a reference while installed
        M.mtmd_log_set(self._cb, None)

    def _log(self, level: int, text: bytes, user_data: Any) -> None:
        self.lines.append(text.decode(errors="replace"))

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        M.mtmd_log_set(L.llama_log_callback(), None)  # NULL: llama.cpp's default logger


@pytest.fixture
def mtmd_log() -> Iterator[MtmdLog]:
    log = MtmdLog()
    yield log
    log.close()


def mtmd_params() -> Any:
    p = M.mtmd_context_params_default()
    p.use_gpu = False
    p.n_threads = THREADS
    p.print_timings = False
    p.warmup = False
    return p


def new_context(model: Any, n_ctx: int = 512) -> Any:
    p = L.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_ctx
    p.n_ubatch = n_ctx
    p.n_seq_max = 1
    p.n_threads = THREADS
    p.n_threads_batch = THREADS
    ctx = L.llama_init_from_model(model, p)
    assert ctx
    return ctx


def tokenize(model: Any, text: str) -> list[int]:
    vocab = L.llama_model_get_vocab(model)
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
    assert n > 0
    return list(buf[:n])


def greedy(ctx: Any, model: Any, prompt: list[int], n: int = N_GREEDY) -> list[int]:
    """Greedy decode ``n`` tokens from an empty KV: one batch for the prompt, then one
    token per llama_decode; argmax of the last position's logits."""
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    tokens = (L.llama_token * len(prompt))(*prompt)
    out: list[int] = []
    batch = L.llama_batch_get_one(tokens, len(prompt))
    for _ in range(n):
        assert L.llama_decode(ctx, batch) == 0
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        assert np.isfinite(logits).all()
        tok = int(np.argmax(logits))
        out.append(tok)
        one = (L.llama_token * 1)(tok)
        batch = L.llama_batch_get_one(one, 1)
        tokens = one  # keep the buffer alive for the next decode
    return out


# ----------------------------------------------------------------------------- projector


def test_projector_loads_and_encodes_an_image(model: Any, out_dir: Path, n_embd: int,
                                              mtmd_log: MtmdLog) -> None:
    assert n_embd == 896  # read from Qwen's GGUF (qwen2.embedding_length)
    spec = ProjectorSpec()
    path = write_vision_projector(out_dir / "mmproj.gguf", n_embd, spec=spec)

    caps = M.mtmd_get_cap_from_file(str(path).encode())
    assert caps.inp_vision and not caps.inp_audio

    ctx = M.mtmd_init_from_file(str(path).encode(), model, mtmd_params())
    assert ctx, mtmd_log.text
    lctx = new_context(model)
    chunks = M.mtmd_input_chunks_init()
    rgb = np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)  # h, w
    bitmap = M.mtmd_bitmap_init(40, 48, rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    try:
        assert M.mtmd_support_vision(ctx)
        assert not M.mtmd_support_audio(ctx)
        assert not M.mtmd_decode_use_mrope(ctx)
        marker = M.mtmd_default_marker()
        assert marker == b"<__media__>"
        assert bitmap and M.mtmd_bitmap_get_nx(bitmap) == 40

        text = f"<|im_start|>user\n{marker.decode()}\nWhat is this?<|im_end|>\n".encode()
        inp = M.mtmd_input_text(text, len(text), True, True)
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0

        kinds = [M.mtmd_input_chunk_get_type(M.mtmd_input_chunks_get(chunks, i))
                 for i in range(M.mtmd_input_chunks_size(chunks))]
        assert kinds == [M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_IMAGE,
                         M.MTMD_INPUT_CHUNK_TYPE_TEXT]
        image = M.mtmd_input_chunks_get(chunks, 1)
        n_image = M.mtmd_input_chunk_get_n_tokens(image)
        # any image is resized to 32x32 and cut in 16x16 patches: 2x2 = 4 tokens
        assert n_image == spec.n_patches == 4
        assert M.mtmd_input_chunk_get_n_pos(image) == 4
        tokens_image = M.mtmd_input_chunk_get_tokens_image(image)
        assert M.mtmd_image_tokens_get_n_tokens(tokens_image) == 4

        assert M.mtmd_encode_chunk(ctx, image) == 0
        embd = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n_image * n_embd,))
        assert np.isfinite(embd).all() and np.abs(embd).max() > 0

        # the whole prompt (text, image embeddings, text) into the text model
        n_total = M.mtmd_helper_get_n_tokens(chunks)
        new_n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 64, True,
                                         ctypes.byref(new_n_past)) == 0
        assert new_n_past.value == n_total == M.mtmd_helper_get_n_pos(chunks)
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,))
        assert np.isfinite(logits).all()
    finally:
        M.mtmd_bitmap_free(bitmap)
        M.mtmd_input_chunks_free(chunks)
        L.llama_free(lctx)
        M.mtmd_free(ctx)


def decode_chunks_by_hand(ctx: Any, lctx: Any, chunks: Any, n_embd: int) -> np.ndarray:
    """What a batching engine does instead of mtmd_helper_eval_chunks: text chunks as
    token batches, media chunks encoded by mtmd and fed as an embedding batch
    (``llama_batch_init(n, n_embd, 1)``: ``batch.embd`` set, ``batch.token`` unused), each
    position and sequence id set by the caller. Returns the last position's logits."""
    pos = 0
    for i in range(M.mtmd_input_chunks_size(chunks)):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        last = i == M.mtmd_input_chunks_size(chunks) - 1
        if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n_out = ctypes.c_size_t(0)
            toks = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
            n = n_out.value
            batch = L.llama_batch_init(n, 0, 1)
            for j in range(n):
                batch.token[j] = toks[j]
        else:
            assert M.mtmd_encode_chunk(ctx, chunk) == 0
            n = M.mtmd_input_chunk_get_n_tokens(chunk)
            embd = M.mtmd_get_output_embd(ctx)
            batch = L.llama_batch_init(n, n_embd, 1)
            ctypes.memmove(batch.embd, embd, n * n_embd * ctypes.sizeof(ctypes.c_float))
        try:
            batch.n_tokens = n
            for j in range(n):
                batch.pos[j] = pos + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = last and j == n - 1
            assert L.llama_decode(lctx, batch) == 0
        finally:
            L.llama_batch_free(batch)
        pos += n  # no M-RoPE here: an image advances the position by its token count
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(L.llama_get_model(lctx)))
    return np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()


def test_image_embeddings_fed_by_hand_match_the_helper(model: Any, out_dir: Path, n_embd: int,
                                                       mtmd_log: MtmdLog) -> None:
    path = write_vision_projector(out_dir / "mmproj-hand.gguf", n_embd)
    ctx = M.mtmd_init_from_file(str(path).encode(), model, mtmd_params())
    assert ctx, mtmd_log.text
    lctx = new_context(model)
    rgb = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    bitmap = M.mtmd_bitmap_init(32, 32, rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    text = b"<|im_start|>user\n" + M.mtmd_default_marker() + b"\nWhat is it?<|im_end|>\n"
    rc, chunks = tokenize_media(ctx, text, [bitmap])
    try:
        assert rc == 0
        assert not M.mtmd_decode_use_non_causal(ctx, M.mtmd_input_chunks_get(chunks, 1))
        new_n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 64, True,
                                         ctypes.byref(new_n_past)) == 0
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        helper = np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        by_hand = decode_chunks_by_hand(ctx, lctx, chunks, n_embd)
        assert np.isfinite(by_hand).all()
        assert int(np.argmax(by_hand)) == int(np.argmax(helper))
        np.testing.assert_allclose(by_hand, helper, rtol=1e-3, atol=1e-3)

        # and the image reaches the model: another image, other logits
        white = np.full((32, 32, 3), 255, np.uint8)
        other = M.mtmd_bitmap_init(32, 32, white.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
        rc, chunks_other = tokenize_media(ctx, text, [other])
        M.mtmd_bitmap_free(other)
        assert rc == 0
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        with_other = decode_chunks_by_hand(ctx, lctx, chunks_other, n_embd)
        M.mtmd_input_chunks_free(chunks_other)
        assert np.abs(with_other - by_hand).max() > 1e-2
    finally:
        M.mtmd_bitmap_free(bitmap)
        M.mtmd_input_chunks_free(chunks)
        L.llama_free(lctx)
        M.mtmd_free(ctx)


def test_projector_of_the_wrong_width_is_refused(model: Any, out_dir: Path,
                                                 mtmd_log: MtmdLog) -> None:
    path = write_vision_projector(out_dir / "mmproj-512.gguf", 512, seed=1)
    ctx = M.mtmd_init_from_file(str(path).encode(), model, mtmd_params())
    assert not ctx  # NULL, not an abort
    assert "mismatch between text model (n_embd = 896) and mmproj (n_embd = 512)" \
        in mtmd_log.text


def test_not_a_projector_is_refused(model: Any, out_dir: Path, mtmd_log: MtmdLog) -> None:
    bad = out_dir / "garbage.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    assert not M.mtmd_init_from_file(str(bad).encode(), model, mtmd_params())
    assert not M.mtmd_init_from_file(str(out_dir / "missing.gguf").encode(), model,
                                     mtmd_params())


def tokenize_media(ctx: Any, text: bytes, bitmaps: list[Any]) -> tuple[int, Any]:
    chunks = M.mtmd_input_chunks_init()
    inp = M.mtmd_input_text(text, len(text), True, True)
    arr = (M.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
    return M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), arr, len(bitmaps)), chunks


def audio_bitmap(seconds: float) -> Any:
    pcm = (np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 0.1).astype(
        np.float32)
    bitmap = M.mtmd_bitmap_init_from_audio(len(pcm), pcm.ctypes.data_as(
        ctypes.POINTER(ctypes.c_float)))  # mtmd copies the samples
    assert bitmap and M.mtmd_bitmap_is_audio(bitmap)
    return bitmap


def test_projector_with_vision_and_audio(model: Any, out_dir: Path, n_embd: int,
                                         mtmd_log: MtmdLog) -> None:
    aspec = AudioSpec()
    path = write_projector(out_dir / "mmproj-av.gguf", n_embd, audio=True, audio_spec=aspec)
    caps = M.mtmd_get_cap_from_file(str(path).encode())
    assert caps.inp_vision and caps.inp_audio
    ctx = M.mtmd_init_from_file(str(path).encode(), model, mtmd_params())
    assert ctx, mtmd_log.text
    audio = audio_bitmap(1.0)
    rgb = np.zeros((32, 32, 3), np.uint8)
    image = M.mtmd_bitmap_init(32, 32, rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    chunks = None
    try:
        assert M.mtmd_support_vision(ctx) and M.mtmd_support_audio(ctx)
        assert M.mtmd_get_audio_sample_rate(ctx) == 16000
        marker = M.mtmd_default_marker()
        # bitmaps are matched to markers in order
        rc, chunks = tokenize_media(ctx, b"hear " + marker + b" see " + marker, [audio, image])
        assert rc == 0
        got = []
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            n = M.mtmd_input_chunk_get_n_tokens(chunk)
            got.append((kind, n) if kind != M.MTMD_INPUT_CHUNK_TYPE_TEXT else (kind,))
            if kind != M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                assert M.mtmd_encode_chunk(ctx, chunk) == 0
                embd = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n * n_embd,))
                assert np.isfinite(embd).all()
        # 1 s of audio is padded to one 30 s window: 375 tokens; the image: 4
        assert got == [(M.MTMD_INPUT_CHUNK_TYPE_TEXT,),
                       (M.MTMD_INPUT_CHUNK_TYPE_AUDIO, aspec.tokens_per_window),
                       (M.MTMD_INPUT_CHUNK_TYPE_TEXT,),
                       (M.MTMD_INPUT_CHUNK_TYPE_IMAGE, 4)]
        assert aspec.tokens_per_window == 375
    finally:
        M.mtmd_bitmap_free(audio)
        M.mtmd_bitmap_free(image)
        if chunks is not None:
            M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(ctx)


def test_audio_into_a_vision_only_projector_is_refused(model: Any, out_dir: Path, n_embd: int,
                                                       mtmd_log: MtmdLog) -> None:
    path = write_vision_projector(out_dir / "mmproj-v.gguf", n_embd)
    ctx = M.mtmd_init_from_file(str(path).encode(), model, mtmd_params())
    audio = audio_bitmap(0.5)
    chunks = None
    try:
        rc, chunks = tokenize_media(ctx, b"hear " + M.mtmd_default_marker(), [audio])
        assert rc == 2  # an error code, not a crash
        assert "model does not support audio input" in mtmd_log.text
        # markers and bitmaps must pair up; this version returns 2 for that too
        mtmd_log.lines.clear()
        rc2, chunks2 = tokenize_media(ctx, b"no marker here", [audio])
        M.mtmd_input_chunks_free(chunks2)
        assert rc2 == 2
        assert "number of media markers in text (0) does not match number of bitmaps (1)" \
            in mtmd_log.text
    finally:
        M.mtmd_bitmap_free(audio)
        if chunks is not None:
            M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(ctx)


# ----------------------------------------------------------------------------- LoRA


@pytest.fixture(scope="module")
def lora_paths(qwen_path: str, out_dir: Path) -> tuple[Path, Path]:
    base = read_base_model(qwen_path)
    return (write_lora_adapter(out_dir / "lora-a.gguf", base, seed=1),
            write_lora_adapter(out_dir / "lora-b.gguf", base, seed=2))


def set_loras(ctx: Any, adapters: list[Any], scales: list[float]) -> None:
    arr = (L.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
    sc = (ctypes.c_float * len(scales))(*scales)
    assert L.llama_set_adapters_lora(ctx, arr if adapters else None, len(adapters),
                                     sc if scales else None) == 0


def adapter_meta(adapter: Any, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_adapter_meta_val_str(adapter, key.encode(), buf, len(buf))
    assert n >= 0
    return buf.value.decode()


def test_lora_adapters_load_and_change_greedy_output(
        model: Any, lora_paths: tuple[Path, Path]) -> None:
    a = L.llama_adapter_lora_init(model, str(lora_paths[0]).encode())
    b = L.llama_adapter_lora_init(model, str(lora_paths[1]).encode())
    assert a and b
    assert adapter_meta(a, "adapter.type") == "lora"
    assert math.isclose(float(adapter_meta(a, "adapter.lora.alpha")), 8.0)
    assert L.llama_adapter_get_alora_n_invocation_tokens(a) == 0

    ctx = new_context(model, 256)
    try:
        prompt = tokenize(model, PROMPT)
        base = greedy(ctx, model, prompt)

        set_loras(ctx, [a], [0.0])
        assert greedy(ctx, model, prompt) == base
        set_loras(ctx, [a], [1.0])
        with_a = greedy(ctx, model, prompt)
        assert with_a != base
        set_loras(ctx, [b], [1.0])
        with_b = greedy(ctx, model, prompt)
        assert with_b != base and with_b != with_a
        set_loras(ctx, [a, b], [1.0, 0.0])  # several at once, one at scale 0
        assert greedy(ctx, model, prompt) == with_a

        set_loras(ctx, [], [])  # detach all: back to the base model
        assert greedy(ctx, model, prompt) == base
    finally:
        L.llama_free(ctx)
        # adapters are freed with the model, or explicitly:
        L.llama_adapter_lora_free(a)
        L.llama_adapter_lora_free(b)


def test_lora_for_another_model_is_refused(model: Any, out_dir: Path, qwen_path: str) -> None:
    base = read_base_model(qwen_path)
    wrong = type(base)(base.arch, base.n_embd, 1,
                       {k: (v[0] * 2, *v[1:]) for k, v in base.tensor_shapes.items()})
    path = write_lora_adapter(out_dir / "lora-wrong.gguf", wrong, seed=3,
                              targets=("attn_q",))
    assert not L.llama_adapter_lora_init(model, str(path).encode())
    assert not L.llama_adapter_lora_init(model, str(out_dir / "missing.gguf").encode())


def test_f16_lora_on_some_tensors_loads(model: Any, out_dir: Path, qwen_path: str) -> None:
    base = read_base_model(qwen_path)
    one_block = type(base)(base.arch, base.n_embd, 1, base.tensor_shapes)
    path = write_lora_adapter(out_dir / "lora-f16.gguf", one_block, seed=4,
                              targets=("attn_q", "attn_v"), dtype=np.float16)
    adapter = L.llama_adapter_lora_init(model, str(path).encode())
    assert adapter
    L.llama_adapter_lora_free(adapter)
