"""Errors: one exception type, the right status, and the API's own JSON shape — OpenAI's
``{"error": {message, type, param, code}}``, Anthropic's ``{"type": "error", "error":
{type, message}}`` on the Anthropic routes (``/v1/messages…``), or Ollama's ``{"error":
message}`` on Ollama's (``/api/…``)."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("llamaserve.api")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          503: "server_error"}


class APIError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self, path: str = "") -> dict[str, object]:
        if anthropic_route(path):
            return anthropic_error(self.status, self.message)
        if ollama_route(path):
            return ollama_error(self.message, self.param)
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(self.body(path), status_code=self.status, headers=self.headers)


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_route(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error(status: int, message: str) -> dict[str, object]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else
                                "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def ollama_route(path: str) -> bool:
    return path.startswith("/api/")


def ollama_error(message: str, param: str | None = None) -> dict[str, object]:
    """Ollama's shape has no field for the parameter: the message names it."""
    if param and param not in message:
        message = f"{param}: {message}"
    return {"error": message}


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(message, param=param, code=code)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response(request.url.path)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Unknown path: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return APIError(message, status=exc.status_code).response(request.url.path)


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return APIError(f"Internal server error: {type(exc).__name__}", status=500,
                    code="internal_error").response(request.url.path)
