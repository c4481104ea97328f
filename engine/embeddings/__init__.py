"""Embeddings and reranking: jobs and their packing into batches (``jobs``), the pooled
context that runs them (``runner``), and rerank prompts laid out as llama-server's
(``rerank``)."""
