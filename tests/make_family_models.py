"""Tiny random-weight llamas that speak a template family the project ships but no small
downloadable model has: gpt-oss's harmony and Gemma 4.

Qwen2.5-Coder's real tokenizer (tests/make_tiny_model.py) with the family's control tokens
written over its unused ``[PAD…]`` entries (so each marker is one control token, as in the
family's own vocabulary, and llama.cpp gives them the family's rules: ``<|return|>`` and
``<|call|>`` end generation, ``<|end|>`` does not, ``<|channel|>`` and friends always
render; Gemma 4's ``<turn|>`` ends a turn), the family's end of turn as EOS, and the
shipped config's chat template as ``tokenizer.chat_template`` (llama-server reads it
there). Nothing but a grammar and a budget guide what such a model writes.

Qwen3.5's XML calls and Qwen2.5's Hermes JSON calls need no new token (``<tool_call>`` is
in Qwen2.5's vocabulary; ``<think>`` is text there): their files are the same llama with
the shipped config's template (Qwen2.5-Coder's config has none: its GGUF's own).

    python tests/make_family_models.py harmony|gemma4|qwen35|hermes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from make_hybrid_model import KV, read_tokenizer_kv  # noqa: E402
from make_tiny_model import write_tiny_model  # noqa: E402

from engine.model_pull import cache_dir, fetch  # noqa: E402

CONFIGS = {"harmony": "gpt-oss-120b.json", "gemma4": "gemma-4-12b-it-qat.json",
           # Qwen's own markup is in Qwen2.5's vocabulary already: the tokenizer as it is
           "qwen35": "qwen3.5-0.8b.json", "hermes": "qwen2.5-coder-0.5b.json"}
TOKENS = {
    "harmony": ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                "<|return|>", "<|call|>"),
    "gemma4": ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>",
               "<tool_call|>", '<|"|>', "<|think|>", "<|tool>", "<tool|>",
               "<|tool_response>", "<tool_response|>"),
}
EOS = {"harmony": "<|return|>", "gemma4": "<turn|>", "qwen35": "<|im_end|>",
       "hermes": "<|im_end|>"}
CONTROL = 3  # GGUF token type
STRING = 8  # GGUF value type


def family_config(family: str) -> dict[str, object]:
    """The shipped config of the family's model (its template and response schema)."""
    data: dict[str, object] = json.loads((ROOT / "configs" / CONFIGS[family]).read_text())
    return data


def chat_template(family: str) -> str:
    """The shipped config's template, else (Qwen2.5-Coder's config) its GGUF's own."""
    template = family_config(family)["model"].get("chat_template")  # type: ignore[attr-defined]
    if template is None:
        return str(read_tokenizer_kv(fetch("qwen-0.5b"))["tokenizer.chat_template"].value)
    return "".join(template) if isinstance(template, list) else str(template)


def family_tokenizer(family: str) -> dict[str, KV]:
    kv = read_tokenizer_kv(fetch("qwen-0.5b"))
    tokens = list(kv["tokenizer.ggml.tokens"].value)
    types = list(kv["tokenizer.ggml.token_type"].value)
    free = [i for i, t in enumerate(tokens) if t.startswith("[PAD")]
    for i, text in zip(free, TOKENS.get(family, ()), strict=False):
        tokens[i], types[i] = text, CONTROL
    out = dict(kv)
    out["tokenizer.ggml.tokens"] = KV(kv["tokenizer.ggml.tokens"].vtype, tokens,
                                      kv["tokenizer.ggml.tokens"].sub_type)
    out["tokenizer.ggml.token_type"] = KV(kv["tokenizer.ggml.token_type"].vtype, types,
                                          kv["tokenizer.ggml.token_type"].sub_type)
    eos = kv["tokenizer.ggml.eos_token_id"]
    out["tokenizer.ggml.eos_token_id"] = KV(eos.vtype, tokens.index(EOS[family]))
    out["tokenizer.chat_template"] = KV(STRING, chat_template(family))
    return out


def family_model_path(family: str) -> Path:
    return cache_dir() / "test-models" / f"tiny-llama-{family}.gguf"


def write_family_model(family: str) -> Path:
    path = family_model_path(family)
    if path.exists():
        return path
    return write_tiny_model(path, tokenizer_from="qwen-0.5b", tokenizer=family_tokenizer(family))


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(CONFIGS):
        print(write_family_model(name))


def server_config(family: str, **model: object) -> dict[str, object]:
    """The family's shipped config (template, response schema) on its tiny model, sized for
    a 2-core CI runner."""
    cfg = family_config(family)
    m: dict[str, object] = cfg["model"]  # type: ignore[assignment]
    for key in ("from_pretrained", "mtmd"):
        m.pop(key, None)
    m.update({"path": str(write_family_model(family)), "alias": f"tiny-{family}",
              "n_ctx": 4096, "n_seq_max": 4, "threads": 2, "threads_batch": 2,
              "n_gpu_layers": 0, "flash_attn": False, **model})
    return cfg


def template_model_path(template_name: str) -> Path:
    stem = template_name.removesuffix(".jinja")
    return cache_dir() / "test-models" / "templates" / f"tiny-{stem}.gguf"


def write_template_model(template_name: str) -> Path:
    """The tiny SmolLM2-tokenizer llama with one of llama.cpp's vendored templates
    (tests/llama_templates.py) as its ``tokenizer.chat_template``: a GGUF of that family
    as llamaserve finds it with ``-m`` alone (its markup is text to this tokenizer)."""
    from llama_templates import template

    path = template_model_path(template_name)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    kv = dict(read_tokenizer_kv(fetch("smollm2")))
    kv["tokenizer.chat_template"] = KV(STRING, template(template_name))
    return write_tiny_model(path, tokenizer_from="smollm2", tokenizer=kv)
