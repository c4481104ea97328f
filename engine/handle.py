"""``ModelHandle``: the one object ``api/`` holds for a loaded model.

Everything the HTTP side asks of a model goes through here: generating, embedding and
reranking (hand a request or a job over, cancel it), the tokenizer, the model's limits, a grammar
check, media tokenization, LoRA adapter names, metrics, health, start and stop. The
handle delegates to the model's ``Engine`` (and through it to the ``Runner`` and the
``Projector``); ``api/`` imports no other engine module that holds llama.cpp state
(``tests/test_api_imports.py``), so the engine could later move to another thread or
process behind this class without the API noticing.

Thread use: ``submit``, ``cancel``, ``cancel_all``, ``submit_embed`` and the health
properties may be called from any thread; the tokenizer, ``rerank_prompts``,
``check_grammar`` and ``tokenize_media`` block (run them on the prepare pool); ``start`` /
``stop`` / ``close`` belong to whoever owns the model's lifetime (the app's lifespan, the
model registry).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.admission import ContextLengthExceeded
from engine.core import Engine, Publish
from engine.embeddings.jobs import EmbedJob
from engine.media.projector import MediaError, MediaInput, MediaPrompt
from engine.request import Request, SamplingParams
from engine.vocabulary import FimTokens

__all__ = [
    "ContextLengthExceeded",
    "EmbedJob",
    "EmbeddingShape",
    "FimTokens",
    "MediaError",
    "MediaInput",
    "MediaPrompt",
    "MediaSupport",
    "ModelHandle",
    "Publish",
    "RerankShape",
]


@dataclass(frozen=True)
class EmbeddingShape:
    """What a model that serves embeddings returns and accepts."""

    dimensions: int  # length of a pooled vector
    max_input: int  # tokens per input


@dataclass(frozen=True)
class RerankShape:
    """What a reranker (rank pooling) accepts."""

    max_input: int  # tokens per (query, document) prompt
    template: bool  # prompts come from the GGUF's rerank template (an LLM reranker)


@dataclass(frozen=True)
class MediaSupport:
    """Which media a model with a projector reads."""

    vision: bool
    audio: bool


class ModelHandle:
    """One loaded model, as the API sees it (a thin, typed delegation to its engine)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._runner = engine.runner
        self._vocabulary = engine.runner.vocabulary

    # -- lifetime ------------------------------------------------------------------------
    def start(self, publish: Publish) -> None:
        """Start the engine thread; ``publish`` receives each step's deltas (on that
        thread, once per step)."""
        self._engine.start(publish)

    def stop(self) -> None:
        """Stop the engine thread (cached sequences go to the disk cache first)."""
        self._engine.stop()

    def close(self) -> None:
        """Free the model's llama.cpp state (after ``stop``)."""
        self._runner.close()

    # -- health --------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """The engine thread is running."""
        return self._engine.alive

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving (None while it has not failed)."""
        return self._engine.failure

    # -- generation ----------------------------------------------------------------------
    def max_new_tokens(self, prompt_len: int, max_tokens: int | None, *,
                       clamp: bool = False) -> int:
        """Admission check for one sequence: the completion budget it gets; raises
        ``ContextLengthExceeded`` when the prompt (plus ``max_tokens``, unless ``clamp``
        cuts it to the room left) can never fit."""
        return self._engine.max_new_tokens(prompt_len, max_tokens, clamp=clamp)

    def submit(self, request: Request) -> None:
        """Queue a sequence; raises ``EngineError`` (or ``BackendUnavailable``) when the
        engine is down."""
        self._engine.submit(request)

    def cancel(self, request: Request) -> None:
        """Stop a sequence at the engine's next step (its final delta still comes)."""
        self._engine.cancel(request)

    def cancel_all(self) -> None:
        """Cancel every sequence the engine holds (the end of a drain)."""
        self._engine.cancel_all()

    def render_special(self, tokens: frozenset[int]) -> None:
        """Control tokens whose text the response parser needs (its markers); other
        control tokens never reach the text."""
        self._engine.delivery.render_special = tokens

    def check_grammar(self, params: SamplingParams) -> None:
        """Raise ``ValueError`` when llama.cpp cannot parse the request's grammar (asked of
        a child process). Blocking."""
        self._runner.check_grammar(params)

    # -- embeddings and reranking ---------------------------------------------------------
    @property
    def embeddings(self) -> EmbeddingShape | None:
        """The embedding shape, or None when the model does not serve embeddings."""
        embedder = self._engine.embedder
        if embedder is None or embedder.rank:
            return None
        return EmbeddingShape(dimensions=embedder.n_embd, max_input=embedder.max_input)

    @property
    def reranker(self) -> RerankShape | None:
        """The rerank shape, or None when the model has no rank pooling."""
        embedder = self._engine.embedder
        if embedder is None or embedder.rerank_format is None:
            return None
        return RerankShape(max_input=embedder.max_input,
                           template=embedder.rerank_format.template is not None)

    def rerank_prompts(self, query: str, documents: list[str]) -> list[list[int]]:
        """One prompt per document, as llama-server builds them
        (``engine.embeddings.rerank``); score them with ``submit_embed``: the first value of
        each row is the score. Blocking."""
        embedder = self._engine.embedder
        assert embedder is not None and embedder.rerank_format is not None, "not a reranker"
        return embedder.rerank_format.prompts(query, documents, self._vocabulary.tokenize)

    def submit_embed(self, job: EmbedJob) -> None:
        """Queue an embedding job (packed with others); raises ``EngineError`` when the
        engine is down. ``job.done`` is called on the engine thread."""
        self._engine.submit_embed(job)

    # -- tokenizer (blocking, thread-safe) -------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        return self._vocabulary.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self._vocabulary.detokenize(tokens, special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes (control tokens are empty unless ``special``)."""
        return self._vocabulary.piece(token, special)

    @property
    def bos_token(self) -> int:
        return self._vocabulary.bos_token

    @property
    def adds_bos(self) -> bool:
        """The vocabulary asks for a BOS token at the start of a prompt."""
        return self._vocabulary.adds_bos

    def special_token_text(self, which: str) -> str:
        """The text of the ``"bos"`` or ``"eos"`` token ("" when the model has none)."""
        return self._vocabulary.special_token_text(which)

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens (None: the model has none)."""
        return self._vocabulary.fim_tokens()

    def chat_template(self) -> str | None:
        """The chat template stored in the GGUF (None: it has none)."""
        return self._vocabulary.chat_template()

    def metadata(self) -> dict[str, str]:
        """The GGUF's scalar and string metadata, as strings (``general.architecture``,
        ``<arch>.context_length``, ...), plus ``general.parameter_count``."""
        return self._vocabulary.metadata()

    # -- limits --------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self._runner.n_vocab

    @property
    def n_ctx(self) -> int:
        """KV cells of the whole context (every sequence)."""
        return self._runner.n_ctx

    @property
    def n_ctx_seq(self) -> int:
        """The longest sequence: prompt plus completion."""
        return self._runner.n_ctx_seq

    @property
    def state_snapshots(self) -> bool:
        """The prefix cache keeps state snapshots (recurrent or sliding-window memory): a
        prompt resumes only where one was taken, so message ends inside a turn matter
        (``Request.message_ends``)."""
        return self._engine.cache.snapshots_on

    @property
    def n_seq_max(self) -> int:
        """Sequences decoded together."""
        return self._runner.n_seq_max

    @property
    def embedding_only(self) -> bool:
        """An embedding model: it cannot generate text."""
        return self._runner.embedding_only

    def kv_bytes(self) -> int:
        """About what the KV cache takes (the model registry's memory limits)."""
        return self._runner.kv_bytes()

    # -- media ---------------------------------------------------------------------------
    @property
    def media(self) -> MediaSupport | None:
        """What the projector reads, or None when the model has no projector."""
        projector = self._engine.projector
        if projector is None:
            return None
        return MediaSupport(vision=projector.vision, audio=projector.audio)

    def tokenize_media(self, parts: Sequence[str | MediaInput],
                       add_special: bool) -> MediaPrompt:
        """Text and media parts → one token list with a span per media; raises
        ``MediaError`` naming the part that failed. Blocking; needs a projector."""
        projector = self._engine.projector
        assert projector is not None, "the model has no projector"
        return projector.tokenize(parts, add_special)

    # -- LoRA ----------------------------------------------------------------------------
    @property
    def adapter_names(self) -> frozenset[str]:
        """The adapters loaded into the model."""
        return frozenset(self._runner.adapters)

    @property
    def default_adapters(self) -> tuple[tuple[str, float], ...]:
        """The set a request runs under unless it names one: the configured scales."""
        return self._engine.default_adapters

    # -- metrics -------------------------------------------------------------------------
    @property
    def metrics_registry(self) -> Any:
        """The engine's Prometheus ``CollectorRegistry`` (one per model)."""
        return self._engine.metrics.registry

    def note_schema_mismatch(self, kind: str, strict: bool) -> None:
        """Count an answer that ended normally and broke its schema (``kind``: "format" or
        "tool")."""
        self._engine.metrics.schema_mismatches.labels(kind, str(strict).lower()).inc()

    def note_slow_client(self) -> None:
        """Count a request cancelled because its client stopped reading."""
        self._engine.metrics.slow_clients.inc()
