"""Write tiny random-weight test models that llama.cpp itself loads: a vision projector
(mmproj) and LoRA adapters for Qwen2.5-Coder-0.5B-Instruct.

No projector or adapter can be downloaded here, so these are built with the ``gguf``
package from the base model's own metadata (text width, block count, tensor shapes).
They carry no knowledge: the projector turns any image into a few embeddings of the
text model's width, the adapters perturb the attention projections. That is enough to
test the plumbing (mtmd and llama.cpp's adapter API) against real loaders.

    python tests/make_test_models.py            # into $LLAMASERVE_CACHE/test-adapters/
    python tests/make_test_models.py OUT_DIR

Projector: LLaVA-style, ``clip.projector_type = "mlp"``: a 2-block ViT (width 32, 2 heads)
on a 32x32 image in 16x16 patches, then ``mm.0`` (Linear) → GELU → ``mm.2`` (Linear) to the
text width. llava's graph stops at the second-to-last block (``n_layer - 1``), so block 0
runs and block 1 is loaded but unused. An image becomes (32/16)² = 4 embeddings.
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


def test_models_dir() -> Path:
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


def write_vision_projector(out: str | Path, n_embd_text: int, *, seed: int = 0,
                           spec: ProjectorSpec = ProjectorSpec()) -> Path:
    """A random LLaVA-style (``mlp``) CLIP vision projector whose output width is
    ``n_embd_text``. Shapes below are numpy order (the reverse of ggml's ne)."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "clip")
    w.add_string("general.name", "llamaserve random test mmproj")
    w.add_string("general.description", "random weights, for tests only")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", spec.image_size)
    w.add_uint32("clip.vision.patch_size", spec.patch_size)
    w.add_uint32("clip.vision.embedding_length", spec.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", spec.n_ff)
    w.add_uint32("clip.vision.block_count", spec.n_layer)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", spec.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])

    d, p = spec.n_embd, spec.patch_size
    ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": _rand(rng, d, 3, p, p),  # Conv2d(3 → d, k=p, stride=p)
        "v.class_embd": _rand(rng, d),
        "v.position_embd.weight": _rand(rng, spec.n_patches + 1, d),  # + class token
        "v.pre_ln.weight": ones.copy(), "v.pre_ln.bias": zeros.copy(),
    }
    for i in range(spec.n_layer):
        b = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{b}.{name}.weight"] = _rand(rng, d, d)
            tensors[f"{b}.{name}.bias"] = zeros.copy()
        tensors[f"{b}.ln1.weight"], tensors[f"{b}.ln1.bias"] = ones.copy(), zeros.copy()
        tensors[f"{b}.ln2.weight"], tensors[f"{b}.ln2.bias"] = ones.copy(), zeros.copy()
        tensors[f"{b}.ffn_up.weight"] = _rand(rng, spec.n_ff, d)
        tensors[f"{b}.ffn_up.bias"] = np.zeros(spec.n_ff, np.float32)
        tensors[f"{b}.ffn_down.weight"] = _rand(rng, d, spec.n_ff)
        tensors[f"{b}.ffn_down.bias"] = zeros.copy()
    tensors["mm.0.weight"] = _rand(rng, spec.mm_hidden, d, std=0.2)
    tensors["mm.0.bias"] = np.zeros(spec.mm_hidden, np.float32)
    tensors["mm.2.weight"] = _rand(rng, n_embd_text, spec.mm_hidden, std=0.2)
    tensors["mm.2.bias"] = np.zeros(n_embd_text, np.float32)
    for name, data in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


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
    for name, path in write_all(args.out_dir or test_models_dir(), args.base).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
