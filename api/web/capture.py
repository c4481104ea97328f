"""Traffic capture: every response the server sends, written to a JSON-lines file.

Set ``LLAMASERVE_CAPTURE_DIR`` and each server process appends one line per HTTP response
(method, path, the request's body, status, content type, body) and per WebSocket message it
sends (and receives) to
``<dir>/<pid>.jsonl``. The test suite turns it on for every server it starts and checks
every captured body against OpenAI's OpenAPI description (``tests/openapi_check.py``).
It is for conformance checks and debugging, never for production: bodies hold user data.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ENV = "LLAMASERVE_CAPTURE_DIR"
MAX_BODY = 8 << 20  # a longer body is cut and marked, not kept whole


class CaptureFile:
    """One process's capture file; writes are whole lines under a lock."""

    def __init__(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line)


class Capture:
    """ASGI middleware that copies responses into a ``CaptureFile``."""

    def __init__(self, app: ASGIApp, directory: str) -> None:
        self.app = app
        self.file = CaptureFile(directory)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        record: dict[str, Any] = {"kind": "http", "method": scope["method"],
                                  "path": scope["path"],
                                  "query": scope.get("query_string", b"").decode("latin-1")}
        chunks: list[bytes] = []
        size = 0
        asked: list[bytes] = []
        asked_size = 0

        async def read() -> Message:  # the request's body, as the app reads it
            nonlocal asked_size
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                if asked_size < MAX_BODY:
                    asked.append(body[:MAX_BODY - asked_size])
                asked_size += len(body)
            return message

        async def capture(message: Message) -> None:
            nonlocal size
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                           for k, v in message.get("headers", [])}
                record["content_type"] = headers.get("content-type", "")
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if size < MAX_BODY:
                    chunks.append(body[:MAX_BODY - size])
                size += len(body)
                if not message.get("more_body", False):
                    record["request"] = b"".join(asked).decode("utf-8", "replace")
                    record["body"] = b"".join(chunks).decode("utf-8", "replace")
                    record["truncated"] = size > MAX_BODY
                    self.file.write(record)
            await send(message)

        await self.app(scope, read, capture)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]

        async def capture(message: Message) -> None:
            if message["type"] == "websocket.send" and message.get("text") is not None:
                self.file.write({"kind": "websocket", "path": path, "body": message["text"]})
            await send(message)

        async def read() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive" and message.get("text") is not None:
                self.file.write({"kind": "websocket", "path": path, "received": True,
                                 "body": message["text"][:MAX_BODY]})
            return message

        await self.app(scope, read, capture)


def capture_directory() -> str | None:
    """Where to capture, from the environment; None leaves capture off."""
    return os.environ.get(ENV) or None
