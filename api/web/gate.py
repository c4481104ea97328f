"""The front door (pure ASGI middleware): API keys, draining, rate limits, in-flight
accounting, HTTP metrics and one access-log line per request.

Keys are compared in constant time (``hmac.compare_digest``). ``/healthz`` is always
public; ``/metrics`` is public unless ``server.metrics_auth``. Handlers may record a
request's model and token counts in ``scope["llamaserve"]`` for the access log.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from api.web.errors import anthropic_error, anthropic_route, ollama_error, ollama_route
from api.web.session import session_key
from engine.config import ServerConfig

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

access_log = logging.getLogger("llamaserve.access")
KNOWN = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses",
         "/v1/rerank", "/rerank", "/v1/reranking", "/reranking", "/v1/score",
         "/v1/models", "/v1/tokenize", "/v1/detokenize", "/apply-template", "/healthz",
         "/health", "/metrics",
         "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/tags",
         "/api/show", "/api/ps", "/api/version", "/api/pull", "/v1/conversations",
         "/v1/files", "/v1/batches"}


def api_path(path: str) -> bool:
    """A route of the APIs (OpenAI's and the others under /v1, llama-server's /infill,
    /rerank and /apply-template, Ollama's /api/…): behind the API keys, counted in
    flight, refused while draining."""
    return path.startswith(("/v1/", "/api/")) or path in (
        "/v1", "/infill", "/rerank", "/reranking", "/apply-template")


# routes with ids in their paths: the label names the route, never the id
_TEMPLATES = (("/v1/responses/input_tokens", "/v1/responses/input_tokens"),
              ("/v1/responses/", "/v1/responses/{id}"),
              ("/v1/conversations/", "/v1/conversations/{id}"),
              ("/v1/models/", "/v1/models/{id}"),
              ("/v1/files/", "/v1/files/{id}"),
              ("/v1/batches/", "/v1/batches/{id}"))


def route_label(path: str) -> str:
    if path in KNOWN:
        return path
    for prefix, label in _TEMPLATES:
        if path == prefix or path.startswith(prefix):
            return label
    return "other"


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("llamaserve_http_requests", "HTTP requests by route and status.",
                                ["route", "status"], registry=registry)
        self.latency = Histogram(
            "llamaserve_http_request_seconds", "HTTP request latency (to the last byte).",
            ["route"], registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.errors = Counter("llamaserve_http_errors", "Error responses by error type.",
                              ["type"], registry=registry)
        self.in_flight = Gauge("llamaserve_http_in_flight", "API requests being served.",
                               registry=registry)
        self.rejected = Counter("llamaserve_http_rejected",
                                "Requests refused before reaching a handler, by reason.",
                                ["reason"], registry=registry)


@dataclass
class GateState:
    draining: bool = False
    in_flight: int = 0  # /v1, /api HTTP requests (streams to their last byte), WS responses
    windows: dict[str, deque[float]] = field(default_factory=dict)


def _error(path: str, status: int, type_: str, code: str, message: str) -> bytes:
    body = anthropic_error(status, message) if anthropic_route(path) else \
        ollama_error(message) if ollama_route(path) else \
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return json.dumps(body).encode()


def api_key(scope: Scope) -> str | None:
    """The API key a request sends (``Authorization: Bearer``, or ``x-api-key``)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            return text[7:].strip() if text.lower().startswith("bearer ") else ""
        if name == b"x-api-key":  # Anthropic's clients
            return str(value.decode("latin-1")).strip()
    return None


class Gate:
    def __init__(self, app: ASGIApp, cfg: ServerConfig, metrics: HttpMetrics,
                 state: GateState) -> None:
        self.app, self.cfg, self.metrics, self.state = app, cfg, metrics, state
        self.keys = [k.encode() for k in cfg.api_keys]

    # -- checks -------------------------------------------------------------------------
    def _key(self, scope: Scope) -> str | None:
        return api_key(scope)

    def _authorized(self, key: str | None) -> bool:
        if not self.keys:
            return True
        given = (key or "").encode()
        ok = False
        for k in self.keys:  # no early exit: the time does not depend on which key matched
            ok |= hmac.compare_digest(given, k)
        return ok

    def _rate_limited(self, who: str) -> float:
        """Seconds until ``who`` may send again (0: allowed now)."""
        limit = self.cfg.rate_limit
        if limit <= 0:
            return 0.0
        now = time.monotonic()
        window = self.state.windows.setdefault(who, deque())
        while window and now - window[0] >= 60.0:
            window.popleft()
        if len(window) >= limit:
            return 60.0 - (now - window[0])
        window.append(now)
        if len(self.state.windows) > 100_000:  # forget idle clients
            for k in [k for k, w in self.state.windows.items() if not w]:
                del self.state.windows[k]
        return 0.0

    def refusal(self, scope: Scope) -> tuple[int, str, str, str, dict[str, str]] | None:
        path: str = scope["path"]
        api = api_path(path)
        if not api and not (path == "/metrics" and self.cfg.metrics_auth):
            return None
        key = self._key(scope)
        if not self._authorized(key):
            return (401, "authentication_error", "invalid_api_key",
                    "Missing or invalid API key: send 'Authorization: Bearer <key>' (or "
                    "'x-api-key: <key>').", {})
        if not api:
            return None
        if self.state.draining:
            return (503, "server_error", "draining",
                    "The server is shutting down; retry on another instance.", {})
        client = scope.get("client") or ("unknown", 0)
        wait = self._rate_limited(key if self.keys and key else str(client[0]))
        if wait > 0:
            return (429, "rate_limit_error", "rate_limit_exceeded",
                    f"Rate limit of {self.cfg.rate_limit} requests per minute exceeded.",
                    {"retry-after": str(max(1, int(wait + 0.999)))})
        return None

    # -- ASGI ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            status, type_, code, message, headers = refusal
            self.metrics.rejected.labels(code).inc()
            self.metrics.errors.labels(type_).inc()
            body = _error(scope["path"], status, type_, code, message)
            if scope["type"] == "websocket":
                if "websocket.http.response" in scope.get("extensions", {}):
                    await send({"type": "websocket.http.response.start", "status": status,
                                "headers": [(b"content-type", b"application/json")]})
                    await send({"type": "websocket.http.response.body", "body": body})
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *[(k.encode(), v.encode()) for k, v in headers.items()]]})
            await send({"type": "http.response.body", "body": body})
            self._log(scope, status, 0.0)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        route = route_label(scope["path"])
        counted = scope["path"].startswith(("/v1/", "/api/"))
        status = 500
        scope["llamaserve"] = {}
        header_key = session_key(scope, None)
        if header_key is not None:
            scope["llamaserve"]["session"] = header_key
        if counted:
            self.state.in_flight += 1
            self.metrics.in_flight.inc()

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                session = scope["llamaserve"].get("session")
                if session is not None:  # for sticky load balancing (api.web.session)
                    message = {**message, "headers": [
                        *message.get("headers", []),
                        (b"x-session-id", session.encode("latin-1", "replace"))]}
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            for release in scope["llamaserve"].pop("leases", []):
                release()  # the models this request used may be unloaded again
            if counted:
                self.state.in_flight -= 1
                self.metrics.in_flight.dec()
            elapsed = time.perf_counter() - started
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(elapsed)
            if status >= 400:
                self.metrics.errors.labels(scope["llamaserve"].get("error_type")
                                           or _status_type(status)).inc()
            self._log(scope, status, elapsed)

    def _log(self, scope: Scope, status: int, elapsed: float) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        info = scope.get("llamaserve") or {}
        client = scope.get("client") or ("-", 0)
        access_log.info('%s "%s %s" %d model=%s prompt_tokens=%s completion_tokens=%s '
                        "%.1fms", client[0], scope.get("method", "WS"), scope["path"], status,
                        info.get("model", "-"), info.get("prompt_tokens", "-"),
                        info.get("completion_tokens", "-"), elapsed * 1000)


def _status_type(status: int) -> str:
    return {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error",
            499: "client_disconnected", 503: "server_error"}.get(status, "server_error")


def note_usage(scope: Scope, model: str, prompt_tokens: int, completion_tokens: int) -> None:
    """Record what the access log reports for this request."""
    info = scope.setdefault("llamaserve", {})
    info.update(model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
