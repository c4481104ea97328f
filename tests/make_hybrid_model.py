"""Write a tiny random-weight GGUF of llama.cpp's Qwen3.5 architecture (``qwen35``): a
hybrid of Gated DeltaNet linear-attention blocks (recurrent state: a conv window and a
delta-rule matrix per sequence) and gated full-attention blocks (a KV cache), with the real
Qwen2.5 tokenizer and chat template copied from Qwen2.5-Coder-0.5B-Instruct.

No Qwen3.5 model can be downloaded here, so this is built with the ``gguf`` package from the
shapes llama.cpp's loader asks for (``src/models/qwen35.cpp``, ``load_arch_tensors``). It
carries no knowledge, but llama.cpp loads it as a hybrid model (``llama_model_is_hybrid``)
and runs the same graph and memory (recurrent state + KV cache) as the real Qwen3.5, so it
tests what a server does with recurrent state: prefix reuse, sequence copies, trimming.

    python tests/make_hybrid_model.py            # $LLAMASERVE_CACHE/test-models/
    python tests/make_hybrid_model.py --mtp      # also the variant with an MTP (nextn) block
    python tests/make_hybrid_model.py OUT.gguf

Model (``HybridSpec`` defaults): width 64, 4 blocks, ``full_attention_interval`` 4, so
blocks 0-2 are linear attention and block 3 full attention. Full attention: 4 query heads
and 2 KV heads of 32 (the query projection makes query + output gate, 2 x 4 x 32), RMS
q/k norms, interleaved M-RoPE (``IMROPE``) on 8 of the 32 dimensions (Qwen3.5's partial
rotary factor 0.25), sections [2, 1, 1, 0]. Linear attention: 2 key heads and 4 value heads
of 16 (``ssm.group_count`` 2, ``ssm.time_step_rank`` 4, ``ssm.state_size`` 16,
``ssm.inner_size`` 64), a causal depthwise conv of width 4 over q|k|v (128 channels).
SwiGLU FFN of 128 everywhere, tied embeddings (no ``output.weight``), vocabulary 151,936
(Qwen2.5's). All F32: 9.9M parameters, 46 MB with the vocabulary (38 MB of tensors,
almost all of them the embedding table).

With ``mtp=True`` a fifth block follows: Qwen3.5's MTP head (``nextn_predict_layers`` 1),
a full-attention block with ``nextn.eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head_norm``
that shares the embeddings and LM head. llama.cpp skips it unless the model is loaded with
``load_mtp``.

Weights are drawn from ``numpy.random.default_rng(seed)``: projections at 1/sqrt(fan_in)
(x3 for those writing back into the residual stream), embeddings at 0.5, norms at 1, the
gated-delta decay and dt bias as Hugging Face initializes them. Logits then have a
standard deviation of about 4 (top token ~7%), so greedy output depends on the whole
context yet does not flip on rounding noise; the same seed writes the same file, and the
``mtp`` variant has the same trunk weights (its block is drawn from ``seed + 1``).
"""

from __future__ import annotations

import argparse
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fetch_models import cache_dir, model_path

ARCH = "qwen35"
FILENAME = "qwen35-hybrid-tiny.gguf"
MTP_FILENAME = "qwen35-hybrid-tiny-mtp.gguf"


def default_out_dir() -> Path:
    return cache_dir() / "test-models"


def default_path(*, mtp: bool = False) -> Path:
    return default_out_dir() / (MTP_FILENAME if mtp else FILENAME)


@dataclass(frozen=True)
class HybridSpec:
    n_embd: int = 64
    n_layer: int = 4  # trunk blocks, MTP block not counted
    full_attention_interval: int = 4  # block i is full attention when (i + 1) % interval == 0
    n_ff: int = 128
    # full attention
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_rot: int = 8  # Qwen3.5: partial_rotary_factor 0.25 of head_dim
    rope_sections: tuple[int, int, int, int] = (2, 1, 1, 0)  # sums to n_rot / 2
    rope_freq_base: float = 10_000_000.0
    # gated delta net (linear attention)
    ssm_conv_kernel: int = 4
    ssm_n_k_heads: int = 2  # ssm.group_count
    ssm_n_v_heads: int = 4  # ssm.time_step_rank
    ssm_head_dim: int = 16  # ssm.state_size; key and value heads have the same width
    # misc
    n_ctx_train: int = 32768
    rms_eps: float = 1e-6
    embd_std: float = 0.5
    # gain of the projections back into the residual stream (attention / linear attention
    # output, FFN down): at 1 the tied embeddings dominate and greedy decoding soon repeats
    # one token; at 3 the mixed context does, and 20 greedy tokens are all different
    out_gain: float = 3.0

    @property
    def ssm_inner(self) -> int:  # value dim; llama.cpp needs inner = state_size * v heads
        return self.ssm_head_dim * self.ssm_n_v_heads

    @property
    def ssm_conv_dim(self) -> int:  # q | k | v channels the conv runs over
        return 2 * self.ssm_head_dim * self.ssm_n_k_heads + self.ssm_inner

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0

    def check(self) -> None:
        if self.n_head % self.n_head_kv or self.ssm_n_v_heads % self.ssm_n_k_heads:
            raise ValueError("query / value heads must be a multiple of key heads")
        if sum(self.rope_sections) * 2 != self.n_rot or self.n_rot > self.head_dim:
            raise ValueError("rope sections must cover n_rot / 2 rotary pairs")
        if not any(self.is_recurrent(i) for i in range(self.n_layer)) or all(
                self.is_recurrent(i) for i in range(self.n_layer)):
            raise ValueError("a hybrid needs both linear- and full-attention blocks")


# ----------------------------------------------------------------------------- tokenizer

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class KV:
    vtype: int  # GGUF value type; for arrays, ``sub_type`` is the element type
    value: Any
    sub_type: int | None = None


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _read_value(f: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype == _STRING:
        raw = f.read(_read(f, "<Q"))
        return raw.decode("utf-8") if keep else None
    if vtype == _ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALAR:
            fmt = _SCALAR[etype]
            data = f.read(struct.calcsize(fmt) * count)
            return np.frombuffer(data, np.dtype(fmt)).tolist() if keep else None
        return [_read_value(f, etype, keep) for _ in range(count)]
    return _read(f, _SCALAR[vtype])


def read_tokenizer_kv(path: str | Path) -> dict[str, KV]:
    """Every ``tokenizer.*`` key of a GGUF (vocabulary, merges, token types, special ids,
    chat template) with its GGUF type, read straight from the header (well under a second
    for Qwen's 152k tokens; ``gguf.GGUFReader`` takes about 10 s)."""
    out: dict[str, KV] = {}
    with open(path, "rb", buffering=1 << 20) as f:
        magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        for _ in range(n_kv):
            key = f.read(_read(f, "<Q")).decode("utf-8")
            vtype = _read(f, "<I")
            keep = key.startswith("tokenizer.")
            if vtype == _ARRAY and keep:
                pos = f.tell()
                sub_type = _read(f, "<I")
                f.seek(pos)
                out[key] = KV(vtype, _read_value(f, vtype, True), sub_type)
            else:
                value = _read_value(f, vtype, keep)
                if keep:
                    out[key] = KV(vtype, value)
    return out


def _add_kv(w: gguf.GGUFWriter, key: str, kv: KV) -> None:
    if kv.vtype != _ARRAY:
        w.add_key_value(key, kv.value, gguf.GGUFValueType(kv.vtype))
        return
    # add_array infers the element type (str → STRING, int → INT32, float → FLOAT32);
    # refuse to change a type rather than write something the loader reads differently
    inferred = gguf.GGUFValueType.get_type(kv.value[0])
    if inferred != kv.sub_type:
        raise ValueError(f"{key}: array of GGUF type {kv.sub_type} would be written as "
                         f"{int(inferred)}")
    w.add_array(key, kv.value)


# ----------------------------------------------------------------------------- weights

Tensors = dict[str, np.ndarray]


def _linear(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    """numpy (n_out, n_in) = ggml ne {n_in, n_out}: llama.cpp's {n_embd, n_out} weights."""
    scale = gain / float(np.sqrt(n_in))
    return (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)


def _ones(n: int) -> np.ndarray:
    return np.ones(n, np.float32)


def _ffn(rng: np.random.Generator, b: str, spec: HybridSpec) -> Tensors:
    return {
        f"{b}.ffn_gate.weight": _linear(rng, spec.n_ff, spec.n_embd),
        f"{b}.ffn_up.weight": _linear(rng, spec.n_ff, spec.n_embd),
        f"{b}.ffn_down.weight": _linear(rng, spec.n_embd, spec.n_ff, spec.out_gain),
    }


def _full_attention(rng: np.random.Generator, b: str, spec: HybridSpec) -> Tensors:
    d, hd = spec.n_embd, spec.head_dim
    return {
        # query and its output gate, interleaved per head: [q_h0 | gate_h0 | q_h1 | ...]
        f"{b}.attn_q.weight": _linear(rng, 2 * hd * spec.n_head, d),
        f"{b}.attn_k.weight": _linear(rng, hd * spec.n_head_kv, d),
        f"{b}.attn_v.weight": _linear(rng, hd * spec.n_head_kv, d),
        f"{b}.attn_output.weight": _linear(rng, d, hd * spec.n_head, spec.out_gain),
        f"{b}.attn_q_norm.weight": _ones(hd),
        f"{b}.attn_k_norm.weight": _ones(hd),
    }


def _linear_attention(rng: np.random.Generator, b: str, spec: HybridSpec) -> Tensors:
    d, h = spec.n_embd, spec.ssm_n_v_heads
    # HF init: A ~ U(1, 16) stored as A_log, the converter writes -exp(A_log);
    # dt_bias = softplus⁻¹(dt) with dt log-uniform in [1e-3, 1e-1]
    a = rng.uniform(1.0, 16.0, h)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), h))
    return {
        f"{b}.attn_qkv.weight": _linear(rng, spec.ssm_conv_dim, d),  # q | k | v
        f"{b}.attn_gate.weight": _linear(rng, spec.ssm_inner, d),  # z, gates the output norm
        # depthwise causal conv: numpy (channels, kernel) = ggml {kernel, channels}
        f"{b}.ssm_conv1d.weight": _linear(rng, spec.ssm_conv_dim, spec.ssm_conv_kernel),
        f"{b}.ssm_dt.bias": (dt + np.log(-np.expm1(-dt))).astype(np.float32),
        f"{b}.ssm_a": (-a).astype(np.float32),
        f"{b}.ssm_beta.weight": _linear(rng, h, d),
        f"{b}.ssm_alpha.weight": _linear(rng, h, d),
        f"{b}.ssm_norm.weight": _ones(spec.ssm_head_dim),
        f"{b}.ssm_out.weight": _linear(rng, d, spec.ssm_inner, spec.out_gain),
    }


def _mtp_block(rng: np.random.Generator, b: str, spec: HybridSpec) -> Tensors:
    d = spec.n_embd
    return {
        f"{b}.attn_norm.weight": _ones(d),
        f"{b}.post_attention_norm.weight": _ones(d),
        **_full_attention(rng, b, spec),
        **_ffn(rng, b, spec),
        f"{b}.nextn.eh_proj.weight": _linear(rng, d, 2 * d),  # [enorm(e) | hnorm(h)] → d
        f"{b}.nextn.enorm.weight": _ones(d),
        f"{b}.nextn.hnorm.weight": _ones(d),
        f"{b}.nextn.shared_head_norm.weight": _ones(d),
    }


def make_tensors(spec: HybridSpec, n_vocab: int, *, seed: int = 0, mtp: bool = False
                 ) -> Tensors:
    rng = np.random.default_rng(seed)
    d = spec.n_embd
    t: Tensors = {
        "token_embd.weight": (rng.standard_normal((n_vocab, d)) * spec.embd_std
                              ).astype(np.float32),
        "output_norm.weight": _ones(d),
    }
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        t[f"{b}.attn_norm.weight"] = _ones(d)
        t[f"{b}.post_attention_norm.weight"] = _ones(d)
        t.update(_linear_attention(rng, b, spec) if spec.is_recurrent(il)
                 else _full_attention(rng, b, spec))
        t.update(_ffn(rng, b, spec))
    if mtp:
        t.update(_mtp_block(np.random.default_rng(seed + 1), f"blk.{spec.n_layer}", spec))
    return t


# ----------------------------------------------------------------------------- file


def write_hybrid_model(out: str | Path | None = None, *, spec: HybridSpec | None = None,
                       tokenizer_from: str | Path | None = None, seed: int = 0,
                       mtp: bool = False) -> Path:
    """Write the model (default: ``default_path(mtp=mtp)``) and return its path. The
    tokenizer and chat template come from ``tokenizer_from`` (default: the cached
    Qwen2.5-Coder-0.5B-Instruct, ``llamaserve pull qwen-0.5b``); the vocabulary size of
    the embeddings is its token count."""
    spec = spec or HybridSpec()
    spec.check()
    out = Path(out) if out is not None else default_path(mtp=mtp)
    source = Path(tokenizer_from) if tokenizer_from is not None else model_path("qwen-0.5b")
    if not source.exists():
        raise FileNotFoundError(f"{source}: fetch it first (llamaserve pull qwen-0.5b)")
    tok = read_tokenizer_kv(source)
    if "tokenizer.ggml.tokens" not in tok:
        raise ValueError(f"{source}: no tokenizer.ggml.tokens")
    n_vocab = len(tok["tokenizer.ggml.tokens"].value)

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(out.suffix + ".partial")
    w = gguf.GGUFWriter(str(partial), ARCH)
    w.add_string("general.name", "llamaserve random test qwen35 hybrid"
                 + (" mtp" if mtp else ""))
    w.add_string("general.description", "random weights, for tests only")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))

    n_blocks = spec.n_layer + (1 if mtp else 0)
    a = f"{ARCH}."
    w.add_uint32(a + "context_length", spec.n_ctx_train)
    w.add_uint32(a + "embedding_length", spec.n_embd)
    w.add_uint32(a + "block_count", n_blocks)
    w.add_uint32(a + "feed_forward_length", spec.n_ff)
    w.add_uint32(a + "attention.head_count", spec.n_head)
    w.add_uint32(a + "attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(a + "attention.key_length", spec.head_dim)
    w.add_uint32(a + "attention.value_length", spec.head_dim)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_float32(a + "rope.freq_base", spec.rope_freq_base)
    w.add_uint32(a + "rope.dimension_count", spec.n_rot)
    w.add_array(a + "rope.dimension_sections", list(spec.rope_sections))
    w.add_uint32(a + "ssm.conv_kernel", spec.ssm_conv_kernel)
    w.add_uint32(a + "ssm.state_size", spec.ssm_head_dim)
    w.add_uint32(a + "ssm.group_count", spec.ssm_n_k_heads)
    w.add_uint32(a + "ssm.time_step_rank", spec.ssm_n_v_heads)
    w.add_uint32(a + "ssm.inner_size", spec.ssm_inner)
    w.add_uint32(a + "full_attention_interval", spec.full_attention_interval)
    if mtp:
        w.add_uint32(a + "nextn_predict_layers", 1)
    for key, kv in tok.items():
        _add_kv(w, key, kv)

    for name, data in make_tensors(spec, n_vocab, seed=seed, mtp=mtp).items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    partial.replace(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=None,
                    help=f"output GGUF (default: {default_path()})")
    ap.add_argument("--mtp", action="store_true",
                    help="also write the variant with an MTP (nextn) block")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="GGUF whose tokenizer.* keys are copied (default: Qwen 0.5B)")
    args = ap.parse_args()
    print(write_hybrid_model(args.out, tokenizer_from=args.tokenizer_from, seed=args.seed))
    if args.mtp:
        mtp_out = None if args.out is None else args.out.with_name(
            args.out.stem + "-mtp" + args.out.suffix)
        print(write_hybrid_model(mtp_out, tokenizer_from=args.tokenizer_from,
                                 seed=args.seed, mtp=True))


if __name__ == "__main__":
    main()
