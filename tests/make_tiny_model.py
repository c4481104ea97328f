"""A tiny random-weight llama that keeps a real model's tokenizer and chat template:
``llama_decode`` costs well under a millisecond per token on a CPU, which puts a server
where a GPU puts it, with its own per-step overhead as the bottleneck (bench/step_overhead.py),
and prefills a 20,000-token agent prompt in seconds (tests/test_compat_claude_code.py).

2 blocks, width 64, 4 heads of 16, SwiGLU 128, tied embeddings. The tokenizer (every
``tokenizer.*`` key, the chat template included) is copied from a real GGUF of the cache:
SmolLM2-135M-Instruct's 49,152 tokens and ChatML (``llamaserve pull smollm2``, the
default), or Qwen2.5-Coder-0.5B-Instruct's 151,936 tokens and tool-calling template
(``tokenizer="qwen-0.5b"``, trained context 32,768). F32; the same seed writes the same
file. It carries no knowledge: it tests serving and protocol, never quality.

    python tests/make_tiny_model.py       # $LLAMASERVE_CACHE/test-models/tiny-llama-smollm2.gguf
    python tests/make_tiny_model.py OUT.gguf [--width 64 --layers 2 --tokenizer qwen-0.5b]
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

from make_hybrid_model import KV, _add_kv, read_tokenizer_kv  # noqa: E402

from engine.model_pull import cache_dir, fetch  # noqa: E402

EOS_CHANNEL = 4.0  # an ending token's value in the channel a model with eos_weight reads
ENDING_EVERY = 5
TRAINED_CONTEXT = {"smollm2": 8192, "qwen-0.5b": 32768}  # the source models' lengths


@dataclass(frozen=True)
class TinySpec:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx_train: int | None = None  # None: the tokenizer's source model's
    rms_eps: float = 1e-5
    # > 0: answers end by themselves after about ENDING_EVERY tokens instead of running to
    # max_tokens, so agent clients see turns end: every ENDING_EVERY-th ordinary token
    # carries a channel of the residual stream no block writes into, and an untied
    # output's end-of-generation row reads it with this weight (12: EOS follows at once)
    eos_weight: float = 0.0


def default_path(tokenizer: str = "smollm2", spec: TinySpec | None = None) -> Path:
    ending = "-ending" if spec is not None and spec.eos_weight > 0 else ""
    return cache_dir() / "test-models" / f"tiny-llama-{tokenizer}{ending}.gguf"


def write_tiny_model(out: str | Path | None = None, spec: TinySpec | None = None,
                     seed: int = 0, tokenizer_from: str = "smollm2",
                     tokenizer: dict[str, KV] | None = None) -> Path:
    """``tokenizer``: these ``tokenizer.*`` keys instead of the source model's (an edited
    copy of them: tests/make_family_models.py)."""
    spec = spec or TinySpec()
    path = Path(out) if out else default_path(tokenizer_from, spec)
    if path.exists():
        return path
    tokenizer = tokenizer or read_tokenizer_kv(fetch(tokenizer_from))
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"].value)
    rng = np.random.default_rng(seed)
    d, hd = spec.n_embd, spec.n_embd // spec.n_head

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    embd = (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32)
    tensors = {"token_embd.weight": embd, "output_norm.weight": np.ones(d, np.float32)}
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
    if spec.eos_weight > 0:
        # its own random rows: a copy of the embedding makes the current token the likeliest
        # next one, and answers repeat one token instead of wandering into an ending one
        output = (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32)
        ids = np.arange(n_vocab)
        normal = np.array(tokenizer["tokenizer.ggml.token_type"].value) == 1
        embd[:, 0] = np.where((ids % ENDING_EVERY == 0) & normal, EOS_CHANNEL, 0.0)
        output[:, 0] = 0.0
        output[int(tokenizer["tokenizer.ggml.eos_token_id"].value), 0] = spec.eos_weight
        tensors["output.weight"] = output
        for il in range(spec.n_layer):  # no block writes into the constant channel
            tensors[f"blk.{il}.attn_output.weight"][0, :] = 0.0
            tensors[f"blk.{il}.ffn_down.weight"][0, :] = 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(partial), "llama")
    w.add_name(f"tiny-llama-{tokenizer_from} (random weights)")
    w.add_context_length(spec.n_ctx_train or TRAINED_CONTEXT[tokenizer_from])
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
    ap.add_argument("--tokenizer", choices=sorted(TRAINED_CONTEXT), default="smollm2")
    ap.add_argument("--eos-weight", type=float, default=0.0)
    args = ap.parse_args()
    print(write_tiny_model(args.out, TinySpec(n_embd=args.width, n_layer=args.layers,
                                              eos_weight=args.eos_weight),
                           tokenizer_from=args.tokenizer))


if __name__ == "__main__":
    main()
