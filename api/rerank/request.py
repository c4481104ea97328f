"""Rerank and score request bodies → (query, documents) pairs; every mistake a 400 naming
the field (pure: no model)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.web.errors import invalid
from api.web.params import Body

# documents per request (pairs for /v1/score): a batch of retrieved passages is tens to
# hundreds; past this a client is better served by several requests
MAX_DOCUMENTS = 1024


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    top_n: int  # results returned, 1..len(documents)
    return_documents: bool


@dataclass(frozen=True)
class ScoreRequest:
    queries: list[str]  # text_1, one per pair
    documents: list[str]  # text_2, one per pair


def _text(value: Any, where: str, param: str) -> str:
    """A document: a string or ``{"text": string}`` (Cohere's and Jina's object form)."""
    if isinstance(value, str):
        return value
    text = value.get("text") if isinstance(value, dict) else None
    if isinstance(text, str):
        return text
    raise invalid(param, f"{where} must be a string or an object with a string 'text', "
                         f"got {json.dumps(value)[:40]}")


def _count(n: int, param: str) -> None:
    if n == 0:
        raise invalid(param, f"'{param}' must hold at least one document")
    if n > MAX_DOCUMENTS:
        raise invalid(param, f"'{param}' may hold at most {MAX_DOCUMENTS} documents, got {n}",
                      code="too_many_documents")


def parse_rerank(body: Body) -> RerankRequest:
    query = body.data.get("query")
    if query is None:
        raise invalid("query", "'query' is required")
    query = _text(query, "'query'", "query")
    raw = body.data.get("documents")
    if raw is None:
        raise invalid("documents", "'documents' is required: a list of strings or "
                                   "{\"text\": ...} objects")
    if not isinstance(raw, list):
        raise invalid("documents", "'documents' must be a list of strings or {\"text\": ...} "
                                   "objects")
    _count(len(raw), "documents")
    documents = [_text(d, f"documents[{i}]", "documents") for i, d in enumerate(raw)]
    top_n = body.integer("top_n", None, 1)
    return RerankRequest(query=query, documents=documents,
                         top_n=len(documents) if top_n is None else min(top_n, len(documents)),
                         return_documents=body.boolean("return_documents", True))


def _texts(body: Body, name: str) -> list[str]:
    raw = body.data.get(name)
    if raw is None:
        raise invalid(name, f"'{name}' is required: a string or a list of strings")
    if isinstance(raw, list):
        _count(len(raw), name)
        return [_text(t, f"{name}[{i}]", name) for i, t in enumerate(raw)]
    return [_text(raw, f"'{name}'", name)]


def parse_score(body: Body) -> ScoreRequest:
    """vLLM's pairing: one text_1 against every text_2 (1:N), or pairwise (N:N)."""
    queries, documents = _texts(body, "text_1"), _texts(body, "text_2")
    if len(queries) == 1:
        queries = queries * len(documents)
    elif len(queries) != len(documents):
        raise invalid("text_2", f"'text_1' and 'text_2' must pair 1:1, 1:N or N:N; got "
                                f"{len(queries)} and {len(documents)} texts")
    _count(len(queries), "text_2")
    return ScoreRequest(queries=queries, documents=documents)
