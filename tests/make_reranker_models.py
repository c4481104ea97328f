"""Write random-weight reranker GGUFs of the two kinds llama.cpp runs with rank pooling.

No reranker can be downloaded here, so these are built with the ``gguf`` package from the
shapes llama.cpp's loaders ask for (``src/models/bert.cpp``, ``src/models/qwen3.cpp``) and
the metadata ``convert_hf_to_gguf.py`` writes for real rerankers. They carry no knowledge:
their scores are noise. They test the plumbing (prompt construction, rank pooling, the
classification head, batching, the API) — never ranking quality.

- ``bert``: a cross-encoder like bge-reranker / ms-marco-MiniLM: bidirectional BERT with
  all-MiniLM-L6-v2's real WordPiece vocabulary (30,522 tokens, ``minilm_source_dir``),
  ``bert.pooling_type`` 4 (RANK) and a RoBERTa-style classification head: ``cls`` (dense +
  tanh) then ``cls.output`` (one logit). The vocabulary asks for BOS, EOS and SEP, and has
  no EOS token, so llama-server builds ``[CLS] query [SEP] [SEP] doc [SEP]`` (EOS falls back
  to SEP), as for XLM-RoBERTa rerankers.
- ``qwen3``: an LLM reranker like Qwen3-Reranker: causal ``qwen3`` with Qwen2.5-Coder's real
  tokenizer (151,936 tokens, ChatML), pooling RANK, ``classifier.output_labels`` [yes, no],
  ``cls.output.weight`` standing for an untied LM head's "yes" and "no" rows (the converter
  keeps only those two),
  and the converter's ``tokenizer.chat_template.rerank`` prompt. llama.cpp scores the last
  token: softmax over (yes, no), the score is P(yes).

    python tests/make_reranker_models.py                 # both, into the test-model cache
    python tests/make_reranker_models.py --size bench    # the wider variants bench/rerank.py uses
    python tests/make_reranker_models.py --kind qwen3 --head q8_0  # its head as Q8_0 (or f16)

F32; the same seed writes the same file.
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

from engine.bert_to_gguf import vocabulary  # noqa: E402
from engine.model_pull import cache_dir, fetch, minilm_source_dir  # noqa: E402

# what convert_hf_to_gguf.py (conversion/qwen.py) writes for Qwen3-Reranker
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


@dataclass(frozen=True)
class RerankerSpec:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4  # qwen3 only (GQA)
    n_ff: int = 128
    n_ctx_train: int = 512


TEST = {"bert": RerankerSpec(), "qwen3": RerankerSpec(n_head_kv=2, n_ctx_train=4096)}
# bench: ms-marco-MiniLM-L-6's shape (384 wide, 6 blocks, 12 heads) and a small qwen3
BENCH = {"bert": RerankerSpec(384, 6, 12, 12, 1536, 512),
         "qwen3": RerankerSpec(256, 4, 8, 4, 768, 4096)}


HEAD_TYPES = ("f32", "f16", "q8_0")  # what qwen3's cls.output may be stored as


def default_path(kind: str, size: str = "test", head: str = "f32") -> Path:
    suffix = ("" if size == "test" else f"-{size}") + ("" if head == "f32" else f"-{head}")
    return cache_dir() / "test-models" / f"reranker-{kind}{suffix}-random.gguf"


def write_reranker(kind: str, size: str = "test", out: str | Path | None = None,
                   seed: int = 0, head: str = "f32") -> Path:
    """The ``kind`` ("bert" or "qwen3") reranker at ``size`` ("test" or "bench"), written
    once into the cache (or ``out``) and reused. ``head``: the type qwen3's ``cls.output``
    is stored as (the same values, rounded; every other tensor is F32)."""
    spec = (TEST if size == "test" else BENCH)[kind]
    assert head in HEAD_TYPES and (head == "f32" or kind == "qwen3")
    path = Path(out) if out else default_path(kind, size, head)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    if kind == "bert":
        _write_bert(partial, spec, np.random.default_rng(seed))
    else:
        _write_qwen3(partial, spec, np.random.default_rng(seed), head)
    partial.replace(path)
    return path


def _linear(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    """numpy (n_out, n_in) = ggml ne {n_in, n_out}."""
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _vec(rng: np.random.Generator, n: int, scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(n) * scale).astype(np.float32)


def _finish(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray],
            types: dict[str, str] | None = None) -> None:
    """Write the tensors: F32, or the type ``types`` names ("f16", "q8_0")."""
    for name, data in tensors.items():
        kind = (types or {}).get(name, "f32")
        values = np.ascontiguousarray(data, dtype=np.float32)
        if kind == "f16":
            w.add_tensor(name, values.astype(np.float16))
        elif kind == "q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(values, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_bert(path: Path, spec: RerankerSpec, rng: np.random.Generator) -> None:
    src = minilm_source_dir()
    if not (src / "vocab.txt").exists():
        fetch("minilm")  # unpacks the sentence-transformers directory
    tokens, types = vocabulary(src)
    ids = {t: i for i, t in enumerate(tokens)}
    d, ff = spec.n_embd, spec.n_ff
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("reranker-bert (random weights)")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(spec.n_layer)
    w.add_head_count(spec.n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_bos_token_id(ids["[CLS]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": (rng.standard_normal((len(tokens), d)) * 0.5).astype(np.float32),
        "token_types.weight": (rng.standard_normal((2, d)) * 0.1).astype(np.float32),
        "position_embd.weight": (rng.standard_normal((spec.n_ctx_train, d)) * 0.1
                                 ).astype(np.float32),
        "token_embd_norm.weight": np.ones(d, np.float32),
        "token_embd_norm.bias": np.zeros(d, np.float32),
    }
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[f"{b}.{proj}.weight"] = _linear(rng, d, d)
            t[f"{b}.{proj}.bias"] = _vec(rng, d)
        t.update({
            f"{b}.attn_output_norm.weight": np.ones(d, np.float32),
            f"{b}.attn_output_norm.bias": np.zeros(d, np.float32),
            f"{b}.ffn_up.weight": _linear(rng, ff, d), f"{b}.ffn_up.bias": _vec(rng, ff),
            f"{b}.ffn_down.weight": _linear(rng, d, ff), f"{b}.ffn_down.bias": _vec(rng, d),
            f"{b}.layer_output_norm.weight": np.ones(d, np.float32),
            f"{b}.layer_output_norm.bias": np.zeros(d, np.float32)})
    # the classification head: dense + tanh, then one logit (scaled so scores spread)
    t["cls.weight"] = _linear(rng, d, d) * 2.0
    t["cls.bias"] = _vec(rng, d)
    t["cls.output.weight"] = _linear(rng, 1, d) * 4.0
    t["cls.output.bias"] = _vec(rng, 1)
    _finish(w, t)


def _write_qwen3(path: Path, spec: RerankerSpec, rng: np.random.Generator,
                 head: str = "f32") -> None:
    tokenizer = read_tokenizer_kv(fetch("qwen-0.5b"))
    vocab: list[str] = tokenizer["tokenizer.ggml.tokens"].value
    n_vocab = len(vocab)
    d, ff, hd = spec.n_embd, spec.n_ff, spec.n_embd // spec.n_head
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("reranker-qwen3 (random weights)")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(d)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, kv in tokenizer.items():
        _add_kv(w, key, kv)
    w.add_chat_template([{"name": "rerank", "template": QWEN3_RERANK_TEMPLATE}])
    embd = (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32)
    t: dict[str, np.ndarray] = {"token_embd.weight": embd,
                                "output_norm.weight": np.ones(d, np.float32)}
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        t.update({
            f"{b}.attn_norm.weight": np.ones(d, np.float32),
            f"{b}.attn_q.weight": _linear(rng, spec.n_head * hd, d),
            f"{b}.attn_k.weight": _linear(rng, spec.n_head_kv * hd, d),
            f"{b}.attn_v.weight": _linear(rng, spec.n_head_kv * hd, d),
            f"{b}.attn_output.weight": _linear(rng, d, spec.n_head * hd),
            f"{b}.attn_q_norm.weight": np.ones(hd, np.float32),
            f"{b}.attn_k_norm.weight": np.ones(hd, np.float32),
            f"{b}.ffn_norm.weight": np.ones(d, np.float32),
            f"{b}.ffn_gate.weight": _linear(rng, ff, d),
            f"{b}.ffn_up.weight": _linear(rng, ff, d),
            f"{b}.ffn_down.weight": _linear(rng, d, ff)})
    # an untied LM head (as Qwen3-Reranker-4B/8B have): the converter writes only its "yes"
    # and "no" rows, in that order, as cls.output; drawn small so P(yes) spreads over (0, 1)
    head_rows = (rng.standard_normal((2, d)) * 0.2).astype(np.float32)
    assert "yes" in vocab and "no" in vocab
    t["cls.output.weight"] = head_rows
    _finish(w, t, {"cls.output.weight": head})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("bert", "qwen3", "both"), default="both")
    ap.add_argument("--size", choices=("test", "bench"), default="test")
    ap.add_argument("--head", choices=HEAD_TYPES, default="f32",
                    help="the type qwen3's cls.output is stored as")
    args = ap.parse_args()
    for kind in ("bert", "qwen3") if args.kind == "both" else (args.kind,):
        print(write_reranker(kind, args.size, head=args.head if kind == "qwen3" else "f32"))


if __name__ == "__main__":
    main()
