"""Reranking: llama-server's / Jina's / Cohere's ``/v1/rerank`` (and ``/rerank``) and
vLLM's ``/v1/score``, over a reranker GGUF's rank pooling (``ModelHandle.reranker``)."""
