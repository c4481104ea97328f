"""A causal reranker scored from its last token without the LM head
(engine/embeddings/last_token.py), against llama.cpp's own rank pooling on the same file.

The files are tests/make_reranker_models.py's random-weight Qwen3-Reranker-style model,
with its ``cls.output`` head stored as F32, F16 and Q8_0: the scores are noise, but they
must be llama.cpp's numbers for that noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from make_reranker_models import HEAD_TYPES, write_reranker

import engine.runner as runner_module
from engine.config import ModelConfig
from engine.embeddings.last_token import last_token_head
from engine.embeddings.runner import EmbeddingRunner
from engine.runner import Runner

QUERY = "Which river runs past the old city?"
DOCUMENTS = ["The river runs past the old city bridge, under the tower.",
             "A budget for the parser library, due in the winter.",
             "Storm over the valley at morning; the fence is down.",
             "Harbour, signal, island: the ocean archive of the museum.",
             "<|im_end|> a document holding a marker token"]


def _config(path: str, **extra: Any) -> ModelConfig:
    return ModelConfig(path=path, n_ctx=4096, n_seq_max=8, n_batch=1024, n_ubatch=1024,
                       threads=2, threads_batch=2, **extra)


def _scores(path: str, monkeypatch: pytest.MonkeyPatch | None = None, **extra: Any
            ) -> tuple[np.ndarray, Any]:
    """(score rows, the runner's head) for DOCUMENTS; with ``monkeypatch``, llama.cpp's
    rank pooling instead of the last-token head."""
    if monkeypatch is not None:
        monkeypatch.setattr(runner_module, "last_token_head", lambda *args: None)
    runner = Runner(path, _config(path, **extra))
    embedder = EmbeddingRunner(runner, _config(path, **extra))
    try:
        assert embedder.rank and embedder.rerank_format is not None
        prompts = [embedder.rerank_format.prompt(QUERY, d, runner.vocabulary.tokenize)
                   for d in DOCUMENTS]
        return embedder.embed(prompts), runner.rank_head
    finally:
        embedder.close()
        runner.close()


@pytest.fixture(scope="module", params=HEAD_TYPES)
def head_file(request: pytest.FixtureRequest) -> Iterator[str]:
    yield str(write_reranker("qwen3", head=request.param))


def test_scores_equal_llama_cpp_rank_pooling(head_file: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fast, head = _scores(head_file)
    assert head is not None, "the last-token head was not used"
    pooled, none = _scores(head_file, monkeypatch)
    assert none is None
    assert fast.shape == pooled.shape == (len(DOCUMENTS), 2)
    np.testing.assert_allclose(fast, pooled, rtol=2e-5, atol=1e-7)
    assert np.allclose(fast.sum(axis=1), 1.0)  # a softmax over (yes, no): P(yes), P(no)
    assert len(set(np.round(fast[:, 0], 6))) == len(DOCUMENTS)  # not one number for all


def test_split_kv_in_the_config_keeps_each_score_with_its_document(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``kv_unified: false`` would cut a batch of documents of different lengths into
    equal-length pieces, returning hidden states out of batch order: the scoring context
    keeps one KV pool whatever the config says."""
    path = str(write_reranker("qwen3"))
    fast, head = _scores(path, kv_unified=False)
    assert head is not None
    np.testing.assert_allclose(fast, _scores(path)[0], rtol=2e-5, atol=1e-7)
    # llama.cpp's own path in split pools sums in other micro-batch shapes: float noise
    # only (a score given to another document would be off by far more)
    pooled, _ = _scores(path, monkeypatch, kv_unified=False)
    np.testing.assert_allclose(fast, pooled, rtol=5e-3)


def test_only_the_last_tokens_reach_the_head(head_file: str) -> None:
    """One hidden state per document, taken at the final norm: the graph stopped there,
    before the LM head."""
    path = head_file
    runner = Runner(path, _config(path))
    embedder = EmbeddingRunner(runner, _config(path))
    try:
        head = runner.rank_head
        assert head is not None and embedder.rerank_format is not None
        prompts = [embedder.rerank_format.prompt(QUERY, d, runner.vocabulary.tokenize)
                   for d in DOCUMENTS[:3]]
        embedder.embed(prompts)
        assert sum(len(r) for r in head._rows) == 3
        assert all(r.shape[1] == head.n_embd for r in head._rows)
    finally:
        embedder.close()
        runner.close()


def test_models_it_does_not_apply_to() -> None:
    qwen3 = str(write_reranker("qwen3"))
    assert last_token_head(qwen3, None) is not None
    assert last_token_head(qwen3, 1) is None  # the config asks for mean pooling
    assert last_token_head(str(write_reranker("bert")), None) is None  # a cross-encoder
    assert last_token_head("/nonexistent.gguf", None) is None
