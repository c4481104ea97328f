"""A tiny random-weight Qwen2-VL pair: a ``qwen2vl`` text model (M-RoPE, rope sections in
its metadata) and a matching ``qwen2vl_merger`` projector, both loaded by llama.cpp itself.

No M-RoPE vision model can be downloaded here, so this writes one with the ``gguf``
package. It carries no knowledge: it tests the plumbing of M-RoPE media (an image advances
the sequence position by ``max(nx, ny)`` while taking ``nx * ny`` KV cells, and its
embeddings carry four position components), never what a model sees.

Text model: Qwen2.5-Coder-0.5B-Instruct's tokenizer and chat template (every
``tokenizer.*`` key, ``<|vision_start|>`` / ``<|vision_end|>`` included), 2 blocks of
width 64, 4 heads of 16 (q/k/v biases as Qwen2 has), SwiGLU 128, an untied output,
``qwen2vl.rope.dimension_sections`` = [2, 3, 3, 0] (a quarter-rotation split like the real
model's [16, 24, 24, 0] of a 128-wide head).

Projector (``clip.projector_type = "qwen2vl_merger"``, as ``tools/mtmd/clip.cpp`` loads it):
two patch convolutions ``v.patch_embd.weight`` / ``.weight.1`` (the two temporal frames,
summed for a still image), one ViT block of width 32 with 2 heads (M-RoPE inside the
encoder, LayerNorm), ``v.post_ln``, then the merger: 2x2 neighbouring patches
concatenated (width 128) → ``mm.0`` → GELU → ``mm.2`` to the text width. Patches are
8x8 pixels, so an image becomes one token per 16x16 pixels (mtmd resizes within
8..4096 tokens): a 64x32 image is a 4x2 grid, 8 tokens, 4 positions.

    python tests/make_vision_model.py   # $LLAMASERVE_CACHE/test-models/qwen2vl-tiny{,-mmproj}.gguf

The same seed writes the same files; they are cached, never committed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from make_hybrid_model import _add_kv, read_tokenizer_kv  # noqa: E402

from engine.model_pull import cache_dir, fetch  # noqa: E402

VERSION = 2  # in the file names: a changed layout never reuses an old cached file


@dataclass(frozen=True)
class VisionSpec:
    n_embd: int = 64  # text width
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    sections: tuple[int, int, int, int] = (2, 3, 3, 0)  # sum: head width / 2
    n_ctx_train: int = 32768
    v_embd: int = 32  # projector (ViT) width
    v_head: int = 2
    v_ff: int = 64
    v_layer: int = 1
    patch: int = 8
    image_size: int = 64


def default_paths() -> tuple[Path, Path]:
    d = cache_dir() / "test-models"
    return d / f"qwen2vl-tiny-v{VERSION}.gguf", d / f"qwen2vl-tiny-v{VERSION}-mmproj.gguf"


def _linear(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)


def _write(path: Path, arch: str, kv: dict[str, object], tensors: dict[str, np.ndarray],
           extra: dict[str, object] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(partial), arch)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, (list, tuple)):
            w.add_array(key, list(value))
        else:
            w.add_uint32(key, int(value))  # type: ignore[call-overload]
    for key, raw in (extra or {}).items():
        _add_kv(w, key, raw)  # type: ignore[arg-type]
    for name, data in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    partial.replace(path)


def write_text_model(path: Path, spec: VisionSpec = VisionSpec(), seed: int = 0) -> Path:
    tokenizer = read_tokenizer_kv(fetch("qwen-0.5b"))
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"].value)
    rng = np.random.default_rng(seed)
    d, hd = spec.n_embd, spec.n_embd // spec.n_head
    d_kv = hd * spec.n_head_kv
    if 2 * sum(spec.sections) != hd:
        raise ValueError("rope sections must sum to half the head width")
    t: dict[str, np.ndarray] = {
        "token_embd.weight": (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32),
        "output_norm.weight": np.ones(d, np.float32),
        # its own rows: tied to the embedding, the current token is the likeliest next one
        # and every answer repeats a single token, blind to positions
        "output.weight": (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32)}
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        t.update({
            f"{b}.attn_norm.weight": np.ones(d, np.float32),
            f"{b}.attn_q.weight": _linear(rng, d, d), f"{b}.attn_q.bias": _linear(rng, d, 1),
            f"{b}.attn_k.weight": _linear(rng, d_kv, d),
            f"{b}.attn_k.bias": _linear(rng, d_kv, 1),
            f"{b}.attn_v.weight": _linear(rng, d_kv, d),
            f"{b}.attn_v.bias": _linear(rng, d_kv, 1),
            f"{b}.attn_output.weight": _linear(rng, d, d),
            f"{b}.ffn_norm.weight": np.ones(d, np.float32),
            f"{b}.ffn_gate.weight": _linear(rng, spec.n_ff, d),
            f"{b}.ffn_up.weight": _linear(rng, spec.n_ff, d),
            f"{b}.ffn_down.weight": _linear(rng, d, spec.n_ff)})
    for k in [k for k in t if k.endswith(".bias")]:
        t[k] = t[k].reshape(-1)
    a = "qwen2vl"
    kv: dict[str, object] = {
        "general.name": "qwen2vl-tiny (random weights, tests only)",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        f"{a}.context_length": spec.n_ctx_train, f"{a}.embedding_length": d,
        f"{a}.block_count": spec.n_layer, f"{a}.feed_forward_length": spec.n_ff,
        f"{a}.attention.head_count": spec.n_head,
        f"{a}.attention.head_count_kv": spec.n_head_kv,
        f"{a}.rope.dimension_count": hd, f"{a}.rope.freq_base": 1000000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.dimension_sections": list(spec.sections)}
    _write(path, a, kv, t, dict(tokenizer))
    return path


def write_merger_projector(path: Path, spec: VisionSpec = VisionSpec(), seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    d, p, n_text = spec.v_embd, spec.patch, spec.n_embd
    t: dict[str, np.ndarray] = {
        # Conv2d(3 → d, k=p, stride=p) for each of the two temporal frames
        "v.patch_embd.weight": (rng.standard_normal((d, 3, p, p)) * 0.05).astype(np.float32),
        "v.patch_embd.weight.1": (rng.standard_normal((d, 3, p, p)) * 0.05).astype(np.float32),
        "v.post_ln.weight": np.ones(d, np.float32), "v.post_ln.bias": np.zeros(d, np.float32),
    }
    for il in range(spec.v_layer):
        b = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t[f"{b}.{name}.weight"] = _linear(rng, d, d)
            t[f"{b}.{name}.bias"] = np.zeros(d, np.float32)
        t[f"{b}.ln1.weight"], t[f"{b}.ln1.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
        t[f"{b}.ln2.weight"], t[f"{b}.ln2.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
        t[f"{b}.ffn_up.weight"] = _linear(rng, spec.v_ff, d)
        t[f"{b}.ffn_up.bias"] = np.zeros(spec.v_ff, np.float32)
        t[f"{b}.ffn_down.weight"] = _linear(rng, d, spec.v_ff)
        t[f"{b}.ffn_down.bias"] = np.zeros(d, np.float32)
    merged = 4 * d  # 2x2 patches side by side
    t["mm.0.weight"] = _linear(rng, merged, merged)
    t["mm.0.bias"] = np.zeros(merged, np.float32)
    # the text model's embeddings are N(0, 0.5): image rows of about that size
    t["mm.2.weight"] = _linear(rng, n_text, merged, gain=0.5)
    t["mm.2.bias"] = np.zeros(n_text, np.float32)
    kv: dict[str, object] = {
        "general.name": "qwen2vl-tiny merger (random weights, tests only)",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        "clip.projector_type": "qwen2vl_merger",
        "clip.has_vision_encoder": True, "clip.has_audio_encoder": False,
        "clip.use_gelu": True,
        "clip.vision.image_size": spec.image_size, "clip.vision.patch_size": p,
        "clip.vision.embedding_length": d, "clip.vision.feed_forward_length": spec.v_ff,
        "clip.vision.block_count": spec.v_layer, "clip.vision.projection_dim": n_text,
        "clip.vision.attention.head_count": spec.v_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.spatial_merge_size": 2,
        "clip.vision.image_mean": [0.48145466, 0.4578275, 0.40821073],
        "clip.vision.image_std": [0.26862954, 0.26130258, 0.27577711]}
    _write(path, "clip", kv, t)
    return path


def write_vision_model(text: Path | None = None, mmproj: Path | None = None
                       ) -> tuple[Path, Path]:
    """Both files (written once, then reused from the cache)."""
    default_text, default_mmproj = default_paths()
    text, mmproj = text or default_text, mmproj or default_mmproj
    if not text.exists():
        write_text_model(text)
    if not mmproj.exists():
        write_merger_projector(mmproj)
    return text, mmproj


if __name__ == "__main__":
    for p in write_vision_model():
        print(p)
