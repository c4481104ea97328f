"""Pooled embeddings through llama.cpp: many inputs, one batch, one sequence id each.

Rank pooling (rerankers: a classification head, ``pooling_type`` 4 in the GGUF or the
config) gives ``llama_model_n_cls_out`` values per input instead of a vector; the first is
the relevance score (``engine/embeddings/rerank.py`` builds the prompts the way llama-server does).
A causal reranker whose head ``engine/embeddings/last_token.py`` can apply runs on a
generation context instead, with one output per input and no LM head.

An embedding-only model (BERT and kin) uses the runner's own context, created with
``embeddings`` on. A generation model configured with ``embedding: true`` gets a
second, small context on the same weights, so embedding batches never touch the
generation context's KV cache (its prefix cache survives). Pooling comes from the
config, else the GGUF, else mean pooling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.embeddings.jobs import EmbedQueue
from engine.embeddings.rerank import RerankFormat, vocab_format
from engine.loading import L, ModelLoadError, new_context
from engine.metrics import EngineMetrics
from engine.request import EngineError
from engine.runner import NumpyBatch, Runner

log = logging.getLogger("llamaserve.engine")

POOLING_NONE, POOLING_MEAN, POOLING_RANK = 0, 1, 4
MAX_EMBED_SEQS = 64  # sequences per embedding batch on a generation model's side context
# Tokens packed into one embedding batch (a single longer input still goes alone, up to
# n_batch). Every token of a batch attends over all of the batch's tokens, masked per
# sequence, so a batch costs more per token the more it holds. In-process, the bench
# rerankers' documents (docs/BENCHMARKS.md): BERT 5-10% faster in batches of 280-560
# tokens than of ~1,100; the Qwen3-style one ~40% faster at 280-560 than at ~1,700; one
# document per batch was slower on both. llama-server packs up to n_batch.
BATCH_TOKENS = 512


class EmbeddingRunner:
    def __init__(self, runner: Runner, cfg: ModelConfig) -> None:
        self.runner = runner
        if runner.embedding_only:
            self.ctx, self._owned = runner.ctx, False
        else:
            side = cfg if cfg.pooling_type not in (None, -1) else _with_pooling(runner, cfg)
            self.ctx = new_context(runner.model, side, embeddings=True, n_ctx=cfg.n_batch,
                                   n_seq_max=min(MAX_EMBED_SEQS, cfg.n_batch))
            self._owned = True
        self.head = runner.rank_head  # a causal reranker scored without its LM head
        self.pooling = POOLING_RANK if self.head else int(L.llama_pooling_type(self.ctx))
        if self.pooling == POOLING_NONE:
            self.close()
            raise ModelLoadError("this model's pooling type cannot produce one vector per "
                                 "input; set model.pooling_type (1 mean, 2 cls, 3 last, "
                                 "4 rank for a reranker)")
        self.mem = L.llama_get_memory(self.ctx)  # NULL for encoder-only models
        self.n_embd = int(L.llama_model_n_embd(runner.model))
        self.rank = self.pooling == POOLING_RANK  # a reranker: scores, not vectors
        # values per input: the pooled vector, or the classification head's outputs
        self.n_out = int(L.llama_model_n_cls_out(runner.model)) if self.rank else self.n_embd
        self.rerank_format = _rerank_format(runner) if self.rank else None
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.batch_tokens = min(self.n_batch, BATCH_TOKENS)  # what a batch packs
        self.n_seq_max = int(L.llama_n_seq_max(self.ctx))
        self.max_input = min(self.n_batch, int(L.llama_model_n_ctx_train(runner.model)))
        if self.mem:  # a causal model: every input needs its KV cells
            self.max_input = min(self.max_input, int(L.llama_n_ctx_seq(self.ctx)))
        self._batch = NumpyBatch(self.n_batch)

    def close(self) -> None:
        if self._owned and self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None

    def run_batch(self, queue: EmbedQueue, metrics: EngineMetrics) -> None:
        """The next batch of ``queue``'s inputs: embedded, counted, and every job it
        completes settled (a failed batch fails its jobs, and only them)."""
        items = queue.next_batch()
        if not items:
            return
        started = time.perf_counter()
        try:
            vectors = self.embed([i.tokens for i in items])
        except Exception as exc:
            log.exception("embedding batch failed; failing its request(s)")
            metrics.step_failures.inc()
            for job in queue.fail(items):
                job.done(None, EngineError(f"{type(exc).__name__}: {exc}"))
            return
        metrics.embed_inputs.inc(len(items))
        metrics.embed_tokens.inc(sum(len(i.tokens) for i in items))
        metrics.embed_batch_seconds.observe(time.perf_counter() - started)
        for job in queue.complete(items, vectors):
            job.done(job.vectors, None)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """Pooled (not normalized) vectors, one row per input, from one batch. The caller
        keeps the batch within ``n_batch`` tokens and ``n_seq_max`` inputs."""
        b = self._batch
        n = 0
        for seq, tokens in enumerate(inputs):
            k = len(tokens)
            b.tok[n : n + k] = tokens
            b.pos[n : n + k] = b.arange[:k]
            b.seq[n : n + k] = seq
            n += k
        b.batch.n_tokens = n
        if self.head is not None:
            return self._scores(len(inputs), n)
        b.out[:n] = 1
        if self.mem:
            L.llama_memory_clear(self.mem, True)
            status = int(L.llama_decode(self.ctx, b.batch))
        else:
            status = int(L.llama_encode(self.ctx, b.batch))
        if status != 0:
            raise RuntimeError(f"llama.cpp embedding batch returned {status}")
        out = np.empty((len(inputs), self.n_out), dtype=np.float32)
        for seq in range(len(inputs)):
            ptr = L.llama_get_embeddings_seq(self.ctx, seq)
            if not ptr:
                raise RuntimeError(f"llama.cpp returned no embedding for sequence {seq}")
            out[seq] = np.ctypeslib.as_array(ptr, shape=(self.n_out,))
        if self.mem:
            L.llama_memory_clear(self.mem, True)
        return out

    def _scores(self, n_inputs: int, n: int) -> np.ndarray:
        """Rank scores from each input's last token (the batch is filled): one output per
        input, the graph stopped before the LM head (``engine/embeddings/last_token.py``)."""
        assert self.head is not None
        b = self._batch
        b.out[:n] = 0
        b.out[np.flatnonzero(np.diff(b.seq[:n], append=-1))] = 1  # each sequence's last
        self.head.begin()
        L.llama_memory_clear(self.mem, True)
        status = int(L.llama_decode(self.ctx, b.batch))
        L.llama_memory_clear(self.mem, True)
        if status != 0:
            raise RuntimeError(f"llama.cpp scoring batch returned {status}")
        return self.head.scores(n_inputs)


def _rerank_format(runner: Runner) -> RerankFormat:
    """How llama-server lays out a (query, document) pair for this model: the GGUF's
    ``rerank`` template, else the vocabulary's BOS / EOS / SEP flags."""
    raw = L.llama_model_chat_template(runner.model, b"rerank")
    v = runner.vocab
    return vocab_format(raw.decode("utf-8") if raw else None,
                        bos=int(L.llama_vocab_bos(v)), eos=int(L.llama_vocab_eos(v)),
                        sep=int(L.llama_vocab_sep(v)), add_bos=bool(L.llama_vocab_get_add_bos(v)),
                        add_eos=bool(L.llama_vocab_get_add_eos(v)),
                        add_sep=bool(L.llama_vocab_get_add_sep(v)))


def _with_pooling(runner: Runner, cfg: ModelConfig) -> ModelConfig:
    """A generation model's GGUF rarely names a pooling type: default to mean."""
    arch = runner.vocabulary.meta("general.architecture") or ""
    gguf_pooling: Any = runner.vocabulary.meta(f"{arch}.pooling_type")
    pooling = int(gguf_pooling) if gguf_pooling not in (None, "0", "-1") else POOLING_MEAN
    return replace(cfg, pooling_type=pooling)
