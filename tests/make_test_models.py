"""Write tiny random-weight test models that llama.cpp itself loads: a vision projector
(mmproj) and LoRA adapters for Qwen2.5-Coder-0.5B-Instruct.

No projector or adapter can be downloaded here, so these are built with the ``gguf``
package from the base model's own metadata (text width, block count, tensor shapes).
They carry no knowledge: the projector turns any image into a few embeddings of the
text model's width, the adapters perturb the attention projections. That is enough to
test the plumbing (mtmd and llama.cpp's adapter API) against real loaders.
Nothing here is Qwen-specific: the fuzz server (tests/fuzz_bodies.py ``fuzz_config``)
writes the same projector and adapters for Gemma 3 270M (width 640; its q/k/v/o shapes,
q 640→1024 and k/v 640→256, come from its header like Qwen's), and llama.cpp loads and
applies them.

    python tests/make_test_models.py            # into $LLAMASERVE_CACHE/test-adapters/
    python tests/make_test_models.py OUT_DIR

Projector: LLaVA-style, ``clip.projector_type = "mlp"``: a 2-block ViT (width 32, 2 heads)
on a 32x32 image in 16x16 patches, then ``mm.0`` (Linear) → GELU → ``mm.2`` (Linear) to the
text width. llava's graph stops at the second-to-last block (``n_layer - 1``), so block 0
runs and block 1 is loaded but unused. Any image (mtmd resizes it) becomes (32/16)² = 4
embeddings, one position each (no M-RoPE, causal).

Audio: ``clip.projector_type = "ultravox"``: a 1-block whisper encoder on 128 mel bins,
frames stacked by 4, RMSNorm → Linear → SwiGLU → RMSNorm → Linear to the text width; audio
at 16 kHz is padded to 30 s windows of 375 embeddings each. ``write_projector(...,
audio=True)`` puts vision and audio in one file (per-modality projector type keys).

LoRA: ``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha``, and
``blk.N.{attn_q,attn_k,attn_v,attn_output}.weight.lora_a`` / ``.lora_b`` for every block,
shaped from the base model's own tensors (see ``write_lora_adapter``).

Files written by ``write_all``/``__main__``: ``qwen-0.5b-mmproj-random.gguf`` (vision),
``qwen-0.5b-mmproj-audio-random.gguf``, ``qwen-0.5b-mmproj-vision-audio-random.gguf``,
``mmproj-random-512.gguf`` (output width 512: mtmd refuses it for Qwen's 896),
``qwen-0.5b-lora-random-a.gguf`` / ``-b.gguf`` (seeds 1 and 2).
"""

from __future__ import annotations

import argparse
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fetch_models import cache_dir, model_path


def default_out_dir() -> Path:
    return cache_dir() / "test-adapters"


# ----------------------------------------------------------------------------- base model


@dataclass(frozen=True)
class BaseModel:
    arch: str
    n_embd: int
    n_layer: int
    tensor_shapes: dict[str, tuple[int, ...]]  # GGUF (ggml) order: ne[0] first


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_header(path: str | Path) -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    """GGUF metadata (arrays are skipped: their value is None) and tensor shapes (ggml ne
    order), read straight from the header. ``gguf.GGUFReader`` gives the same, but it
    parses the 152k-token vocabulary element by element (about 10 s on this machine)."""
    with open(path, "rb") as f:
        head = f.read(24)
        magic, _version, n_tensors, n_kv = struct.unpack("<4sIQQ", head)
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        buf = f.read(1 << 20)
        pos = 0

        def need(n: int) -> None:
            nonlocal buf, pos
            while len(buf) - pos < n:
                more = f.read(max(n, 1 << 20))
                if not more:
                    raise ValueError(f"{path}: truncated GGUF header")
                buf = buf[pos:] + more
                pos = 0

        def unpack(fmt: str) -> object:
            nonlocal pos
            size = struct.calcsize(fmt)
            need(size)
            (v,) = struct.unpack_from(fmt, buf, pos)
            pos += size
            return v

        def string() -> str:
            nonlocal pos
            n = int(unpack("<Q"))  # type: ignore[call-overload]
            need(n)
            s = buf[pos:pos + n].decode("utf-8", errors="replace")
            pos += n
            return s

        def skip_value(vtype: int) -> None:
            nonlocal pos
            if vtype == _STRING:
                string()
            elif vtype == _ARRAY:
                etype, count = int(unpack("<I")), int(unpack("<Q"))  # type: ignore[call-overload]
                if etype in _SCALAR:
                    size = struct.calcsize(_SCALAR[etype]) * count
                    need(size)
                    pos += size
                else:
                    for _ in range(count):
                        skip_value(etype)
            else:
                unpack(_SCALAR[vtype])

        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = string()
            vtype = int(unpack("<I"))  # type: ignore[call-overload]
            if vtype == _STRING:
                meta[key] = string()
            elif vtype == _ARRAY:
                skip_value(vtype)
                meta[key] = None
            else:
                meta[key] = unpack(_SCALAR[vtype])
        shapes: dict[str, tuple[int, ...]] = {}
        for _ in range(n_tensors):
            name = string()
            n_dims = int(unpack("<I"))  # type: ignore[call-overload]
            shapes[name] = tuple(int(unpack("<Q")) for _ in range(n_dims))  # type: ignore[call-overload]
            unpack("<I")  # type
            unpack("<Q")  # data offset
        return meta, shapes


def read_base_model(path: str | Path) -> BaseModel:
    meta, shapes = read_gguf_header(path)
    arch = str(meta["general.architecture"])
    return BaseModel(arch=arch, n_embd=int(meta[f"{arch}.embedding_length"]),  # type: ignore[call-overload]
                     n_layer=int(meta[f"{arch}.block_count"]),  # type: ignore[call-overload]
                     tensor_shapes=shapes)


def text_embedding_width(path: str | Path) -> int:
    return read_base_model(path).n_embd


# ----------------------------------------------------------------------------- projector


@dataclass(frozen=True)
class ProjectorSpec:
    image_size: int = 32
    patch_size: int = 16
    n_embd: int = 32  # ViT width
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 2
    mm_hidden: int = 64  # width between mm.0 and mm.2

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def _rand(rng: np.random.Generator, *shape: int, std: float = 0.02) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


@dataclass(frozen=True)
class AudioSpec:
    """Whisper-style encoder + Ultravox projector. Audio is cut into 30 s windows of
    3000 mel frames (shorter audio is padded to one window); the two convolutions halve
    that to 1500 positions and the projector stacks ``stack_factor`` of them into one
    token: 1500 / 4 = 375 tokens per window. The stack factor must divide 1500: with 8
    the graph makes 188 tokens where mtmd expects 187 and clip_encode GGML_ABORTs
    ("Invalid number of output tokens"), killing the process."""

    n_mel: int = 128
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 1
    n_ctx: int = 1500  # position embeddings: one window after the stride-2 conv
    stack_factor: int = 4
    mm_hidden: int = 64  # after SwiGLU (mm.a.mlp.1 makes 2 * mm_hidden)

    @property
    def tokens_per_window(self) -> int:
        return 1500 // self.stack_factor


Tensors = dict[str, np.ndarray]


def _vision_part(rng: np.random.Generator, n_embd_text: int, spec: ProjectorSpec
                 ) -> tuple[dict[str, object], Tensors]:
    kv: dict[str, object] = {
        "clip.vision.image_size": spec.image_size,
        "clip.vision.patch_size": spec.patch_size,
        "clip.vision.embedding_length": spec.n_embd,
        "clip.vision.feed_forward_length": spec.n_ff,
        "clip.vision.block_count": spec.n_layer,
        "clip.vision.projection_dim": n_embd_text,
        "clip.vision.attention.head_count": spec.n_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-5,
        "clip.vision.image_mean": [0.48145466, 0.4578275, 0.40821073],
        "clip.vision.image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    d, p = spec.n_embd, spec.patch_size
    t: Tensors = {
        "v.patch_embd.weight": _rand(rng, d, 3, p, p),  # Conv2d(3 → d, k=p, stride=p)
        "v.class_embd": _rand(rng, d),
        "v.position_embd.weight": _rand(rng, spec.n_patches + 1, d),  # + class token
        "v.pre_ln.weight": _ones(d),
        "v.pre_ln.bias": _zeros(d),
    }
    for i in range(spec.n_layer):
        t.update(_block(rng, f"v.blk.{i}", d, spec.n_ff, k_bias=True))
    t["mm.0.weight"] = _rand(rng, spec.mm_hidden, d, std=0.2)
    t["mm.0.bias"] = _zeros(spec.mm_hidden)
    t["mm.2.weight"] = _rand(rng, n_embd_text, spec.mm_hidden, std=0.2)
    t["mm.2.bias"] = _zeros(n_embd_text)
    return kv, t


def _audio_part(rng: np.random.Generator, n_embd_text: int, spec: AudioSpec
                ) -> tuple[dict[str, object], Tensors]:
    kv: dict[str, object] = {
        "clip.audio.embedding_length": spec.n_embd,
        "clip.audio.feed_forward_length": spec.n_ff,
        "clip.audio.block_count": spec.n_layer,
        "clip.audio.projection_dim": n_embd_text,
        "clip.audio.attention.head_count": spec.n_head,
        "clip.audio.attention.layer_norm_epsilon": 1e-5,
        "clip.audio.num_mel_bins": spec.n_mel,
        "clip.audio.projector.stack_factor": spec.stack_factor,
    }
    d = spec.n_embd
    t: Tensors = {
        # Conv1d(n_mel → d, k=3, pad 1) and Conv1d(d → d, k=3, stride 2, pad 1); the
        # biases are (d, 1) so they broadcast over time
        "a.conv1d.1.weight": _rand(rng, d, spec.n_mel, 3),
        "a.conv1d.1.bias": np.zeros((d, 1), np.float32),
        "a.conv1d.2.weight": _rand(rng, d, d, 3),
        "a.conv1d.2.bias": np.zeros((d, 1), np.float32),
        "a.position_embd.weight": _rand(rng, spec.n_ctx, d),
        "a.post_ln.weight": _ones(d),
        "a.post_ln.bias": _zeros(d),
    }
    for i in range(spec.n_layer):  # whisper: no bias on k (the graph asserts it)
        t.update(_block(rng, f"a.blk.{i}", d, spec.n_ff, k_bias=False))
    stacked = d * spec.stack_factor
    t["mm.a.norm_pre.weight"] = _ones(stacked)  # RMSNorm
    t["mm.a.mlp.1.weight"] = _rand(rng, 2 * spec.mm_hidden, stacked, std=0.2)  # → SwiGLU
    t["mm.a.norm_mid.weight"] = _ones(spec.mm_hidden)  # RMSNorm
    t["mm.a.mlp.2.weight"] = _rand(rng, n_embd_text, spec.mm_hidden, std=0.2)
    return kv, t


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def _block(rng: np.random.Generator, b: str, d: int, n_ff: int, *, k_bias: bool) -> Tensors:
    """One pre-norm ViT / whisper encoder block (LayerNorm with bias, GELU FFN)."""
    t: Tensors = {}
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        t[f"{b}.{name}.weight"] = _rand(rng, d, d)
        if name != "attn_k" or k_bias:
            t[f"{b}.{name}.bias"] = _zeros(d)
    t[f"{b}.ln1.weight"], t[f"{b}.ln1.bias"] = _ones(d), _zeros(d)
    t[f"{b}.ln2.weight"], t[f"{b}.ln2.bias"] = _ones(d), _zeros(d)
    t[f"{b}.ffn_up.weight"], t[f"{b}.ffn_up.bias"] = _rand(rng, n_ff, d), _zeros(n_ff)
    t[f"{b}.ffn_down.weight"], t[f"{b}.ffn_down.bias"] = _rand(rng, d, n_ff), _zeros(d)
    return t


def write_projector(out: str | Path, n_embd_text: int, *, vision: bool = True,
                    audio: bool = False, seed: int = 0,
                    spec: ProjectorSpec = ProjectorSpec(),
                    audio_spec: AudioSpec = AudioSpec()) -> Path:
    """A random mmproj GGUF whose output width is ``n_embd_text``: a LLaVA-style
    (``mlp``) vision encoder, an Ultravox (``ultravox``) audio encoder, or both in one
    file (then each modality names its projector type: ``clip.vision.projector_type`` /
    ``clip.audio.projector_type``). Shapes here are numpy order (the reverse of ggml's ne).
    """
    if not (vision or audio):
        raise ValueError("a projector needs vision, audio or both")
    out = Path(out)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "clip")
    w.add_string("general.name", "llamaserve random test mmproj")
    w.add_string("general.description", "random weights, for tests only")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    if vision and audio:
        w.add_string("clip.vision.projector_type", "mlp")
        w.add_string("clip.audio.projector_type", "ultravox")
    else:
        w.add_string("clip.projector_type", "mlp" if vision else "ultravox")
    w.add_bool("clip.has_vision_encoder", vision)
    w.add_bool("clip.has_audio_encoder", audio)
    w.add_bool("clip.use_gelu", True)
    kv: dict[str, object] = {}
    tensors: Tensors = {}
    if vision:
        kv_v, t_v = _vision_part(rng, n_embd_text, spec)
        kv.update(kv_v)
        tensors.update(t_v)
    if audio:
        kv_a, t_a = _audio_part(rng, n_embd_text, audio_spec)
        kv.update(kv_a)
        tensors.update(t_a)
    for key, value in kv.items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))  # type: ignore[call-overload]
    for name, data in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_vision_projector(out: str | Path, n_embd_text: int, *, seed: int = 0,
                           spec: ProjectorSpec = ProjectorSpec()) -> Path:
    return write_projector(out, n_embd_text, seed=seed, spec=spec)


def write_audio_projector(out: str | Path, n_embd_text: int, *, seed: int = 0,
                          spec: AudioSpec = AudioSpec()) -> Path:
    return write_projector(out, n_embd_text, vision=False, audio=True, seed=seed,
                           audio_spec=spec)


# ----------------------------------------------------------------------------- LoRA

LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output")


def write_lora_adapter(out: str | Path, base: BaseModel, *, seed: int = 0, rank: int = 8,
                       alpha: float = 8.0, b_scale: float = 0.1,
                       targets: tuple[str, ...] = LORA_TARGETS,
                       dtype: type = np.float32) -> Path:
    """A random LoRA adapter for ``base``: for every block and target ``blk.N.T.weight``
    of ggml shape [n_in, n_out] (numpy (n_out, n_in)), ``lora_a`` is numpy (rank, n_in)
    and ``lora_b`` numpy (n_out, rank) — llama.cpp checks a.ne[0] == W.ne[0],
    b.ne[1] == W.ne[1] and a.ne[1] == b.ne[0]. llama.cpp adds
    ``scale * alpha / rank * B @ (A @ x)``; A is N(0, 1/n_in) so A @ x keeps x's size,
    and ``b_scale`` is the standard deviation of B (0 would be a no-op adapter).

    On Qwen2.5-Coder-0.5B (rank 8, alpha 8, q/k/v/o of all 24 blocks) greedy output of
    "def fibonacci(n):" is "\n    if n <= 0:\n" without an adapter; b_scale 0.03 changes
    one token for one seed only, 0.06 one token for both seeds ("if n == 0", "if n < 1"),
    0.1 (the default) turns it into unrelated tokens, still with finite logits (0.5 too).
    So at the default, scale 1 is unmistakable and scale ~0.5 is a mild change."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), base.arch)
    w.add_string("general.type", "adapter")
    w.add_string("general.name", f"llamaserve random test lora seed {seed}")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32 if dtype == np.float32
                                          else gguf.LlamaFileType.MOSTLY_F16))
    for i in range(base.n_layer):
        for t in targets:
            name = f"blk.{i}.{t}.weight"
            n_in, n_out = base.tensor_shapes[name][:2]
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * b_scale
            w.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a, dtype=dtype))
            w.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b, dtype=dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# ----------------------------------------------------------------------------- all


def write_all(out_dir: str | Path, base_model: str | Path | None = None) -> dict[str, Path]:
    """Every test model for Qwen2.5-Coder-0.5B into ``out_dir``; returns name → path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = read_base_model(base_model or model_path("qwen-0.5b"))
    return {
        "mmproj": write_vision_projector(out_dir / "qwen-0.5b-mmproj-random.gguf", base.n_embd),
        "mmproj-audio": write_audio_projector(out_dir / "qwen-0.5b-mmproj-audio-random.gguf",
                                              base.n_embd),
        "mmproj-vision-audio": write_projector(
            out_dir / "qwen-0.5b-mmproj-vision-audio-random.gguf", base.n_embd, audio=True),
        "mmproj-mismatch": write_vision_projector(
            out_dir / "mmproj-random-512.gguf", 512, seed=1),
        "lora-a": write_lora_adapter(out_dir / "qwen-0.5b-lora-random-a.gguf", base, seed=1),
        "lora-b": write_lora_adapter(out_dir / "qwen-0.5b-lora-random-b.gguf", base, seed=2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", type=Path, default=None)
    ap.add_argument("--base", type=Path, default=None, help="base GGUF (default: Qwen 0.5B)")
    args = ap.parse_args()
    for name, path in write_all(args.out_dir or default_out_dir(), args.base).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
