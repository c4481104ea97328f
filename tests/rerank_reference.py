"""Reranker scores computed without llama.cpp's graph: the reference the server's scores
must equal (tests/test_api_rerank.py).

The weights are read straight from the GGUF file, the (query, document) prompt is laid out
from llama-server's ``format_prompt_rerank`` as its C++ reads (not from
``engine/embeddings/rerank.py``),
and the forward pass is numpy: BERT (post-norm, GELU, CLS → dense + tanh → one logit) and
qwen3 (RMSNorm, q/k norms, NEOX RoPE, causal GQA attention, SwiGLU, last token → yes/no
logits → softmax, P(yes)). Only the tokenizer is llama.cpp's (through the bindings' own
``Llama(vocab_only=True)``), since a score is only comparable on the same tokens.

    python tests/rerank_reference.py MODEL.gguf "query" "document" ...
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_hybrid_model import _read, _read_value

_F32 = 0


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Scalar and string metadata (arrays skipped) and every F32 tensor (numpy shape: ggml's
    ne reversed, so a weight is (n_out, n_in))."""
    meta: dict[str, Any] = {}
    infos = []
    with open(path, "rb", buffering=1 << 20) as f:
        magic, _version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF"
        for _ in range(n_kv):
            key = f.read(_read(f, "<Q")).decode()
            vtype = _read(f, "<I")
            value = _read_value(f, vtype, vtype != 9)  # arrays are not kept
            if vtype != 9:
                meta[key] = value
        for _ in range(n_tensors):
            name = f.read(_read(f, "<Q")).decode()
            dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            ttype, offset = _read(f, "<I"), _read(f, "<Q")
            assert ttype == _F32, f"{name}: only F32 tensors are read"
            infos.append((name, dims, offset))
        align = int(meta.get("general.alignment", 32))
        start = (f.tell() + align - 1) // align * align
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, dims, offset in infos:
        n = int(np.prod(dims))
        at = start + offset
        tensors[name] = np.frombuffer(raw[at : at + 4 * n], np.float32).reshape(dims[::-1])
    return meta, tensors


@dataclass
class Reference:
    path: str

    def __post_init__(self) -> None:
        import llama_cpp

        self.meta, self.t = read_gguf(self.path)
        self.arch = self.meta["general.architecture"]
        self.vocab = llama_cpp.Llama(self.path, vocab_only=True, verbose=False)

    def _tokens(self, text: str, special: bool) -> list[int]:
        return list(self.vocab.tokenize(text.encode(), add_bos=False, special=special))

    def prompt(self, query: str, document: str) -> list[int]:
        """llama-server's format_prompt_rerank."""
        template = self.meta.get("tokenizer.chat_template.rerank")
        if template is not None:
            text = template.replace("{query}", query).replace("{document}", document)
            return self._tokens(text, True)
        m = self.meta
        bos, sep = m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.seperator_token_id"]
        eos = m.get("tokenizer.ggml.eos_token_id", sep)  # EOS, else SEP
        out = [bos] if m.get("tokenizer.ggml.add_bos_token") else []
        out += self._tokens(query, False)
        if m.get("tokenizer.ggml.add_eos_token"):
            out.append(eos)
        if m.get("tokenizer.ggml.add_sep_token"):
            out.append(sep)
        out += self._tokens(document, False)
        if m.get("tokenizer.ggml.add_eos_token"):
            out.append(eos)
        return out

    def score(self, query: str, document: str) -> float:
        tokens = self.prompt(query, document)
        return self._bert(tokens) if self.arch == "bert" else self._qwen3(tokens)

    # -- forward passes ----------------------------------------------------------------
    def _bert(self, ids: list[int]) -> float:
        t, eps = self.t, float(self.meta["bert.attention.layer_norm_epsilon"])
        n_head = int(self.meta["bert.attention.head_count"])

        def norm(x: np.ndarray, name: str) -> np.ndarray:
            x = x - x.mean(-1, keepdims=True)
            x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
            return x * t[f"{name}.weight"] + t[f"{name}.bias"]

        def lin(x: np.ndarray, name: str) -> np.ndarray:
            return x @ t[f"{name}.weight"].T + t[f"{name}.bias"]

        n = len(ids)
        x = t["token_embd.weight"][ids] + t["token_types.weight"][0] + \
            t["position_embd.weight"][:n]
        x = norm(x.astype(np.float64), "token_embd_norm")
        for il in range(int(self.meta["bert.block_count"])):
            b = f"blk.{il}"
            heads = [lin(x, f"{b}.attn_{p}").reshape(n, n_head, -1).transpose(1, 0, 2)
                     for p in "qkv"]
            q, k, v = heads
            a = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])) @ v
            x = norm(lin(a.transpose(1, 0, 2).reshape(n, -1), f"{b}.attn_output") + x,
                     f"{b}.attn_output_norm")
            h = lin(x, f"{b}.ffn_up")
            h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
            x = norm(lin(h, f"{b}.ffn_down") + x, f"{b}.layer_output_norm")
        pooled = np.tanh(lin(x[0], "cls"))
        return float(lin(pooled, "cls.output")[0])

    def _qwen3(self, ids: list[int]) -> float:
        t, m = self.t, self.meta
        eps = float(m["qwen3.attention.layer_norm_rms_epsilon"])
        n_head, n_kv = int(m["qwen3.attention.head_count"]), int(m["qwen3.attention.head_count_kv"])
        base = float(m["qwen3.rope.freq_base"])

        def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

        n = len(ids)
        x = t["token_embd.weight"][ids].astype(np.float64)
        hd = t["blk.0.attn_q_norm.weight"].shape[0]
        inv = base ** (-np.arange(0, hd // 2) * 2.0 / hd)
        ang = np.arange(n)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rope(z: np.ndarray) -> np.ndarray:  # NEOX: the two halves rotate together
            a, b = z[..., : hd // 2], z[..., hd // 2 :]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

        mask = np.triu(np.full((n, n), -np.inf), 1)
        for il in range(int(m["qwen3.block_count"])):
            b = f"blk.{il}"
            h = rms(x, t[f"{b}.attn_norm.weight"])
            q = rope(rms((h @ t[f"{b}.attn_q.weight"].T).reshape(n, n_head, hd),
                         t[f"{b}.attn_q_norm.weight"]))
            k = rope(rms((h @ t[f"{b}.attn_k.weight"].T).reshape(n, n_kv, hd),
                         t[f"{b}.attn_k_norm.weight"]))
            v = (h @ t[f"{b}.attn_v.weight"].T).reshape(n, n_kv, hd)
            group = n_head // n_kv
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            a = np.einsum("hqk,khd->qhd", _softmax(s), v).reshape(n, -1)
            x = x + a @ t[f"{b}.attn_output.weight"].T
            h = rms(x, t[f"{b}.ffn_norm.weight"])
            g = h @ t[f"{b}.ffn_gate.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ t[f"{b}.ffn_up.weight"].T)) @ \
                t[f"{b}.ffn_down.weight"].T
        last = rms(x[-1], t["output_norm.weight"])
        return float(_softmax(t["cls.output.weight"] @ last)[0])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


if __name__ == "__main__":
    ref = Reference(sys.argv[1])
    for doc in sys.argv[3:]:
        print(f"{ref.score(sys.argv[2], doc):.7f}  {doc}")
