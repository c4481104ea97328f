"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags`` …) over the
same chat path, engine and embeddings as the OpenAI routes: for the tools built for Ollama
(Open WebUI, Continue, n8n, the ``ollama`` libraries). docs/OLLAMA.md is the reference."""
