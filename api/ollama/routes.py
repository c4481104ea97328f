"""Ollama's routes, as the app mounts them (``api/web/app.py``)."""

from __future__ import annotations

from starlette.routing import Route

from api.ollama.chat import chat
from api.ollama.embed import embed, embeddings
from api.ollama.generate import generate
from api.ollama.models import ps, pull, show, tags, version

OLLAMA_ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/pull", pull, methods=["POST"]),
]
