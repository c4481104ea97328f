"""api/web/capture.py: what a captured exchange holds (the request's body, the answer whole
even when streamed in parts, both directions of a WebSocket), on a small Starlette app."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from api.web.capture import MAX_BODY, Capture


async def echo(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({"got": len(body["text"])})


async def parts(request: Request) -> StreamingResponse:
    async def chunks() -> Any:
        for word in ("data: a\n\n", "data: b\n\n"):
            yield word
    return StreamingResponse(chunks(), media_type="text/event-stream")


async def socket(ws: WebSocket) -> None:
    await ws.accept()
    text = await ws.receive_text()
    await ws.send_text(json.dumps({"echo": text}))
    await ws.close()


def records(tmp_path: Path) -> list[dict[str, Any]]:
    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/parts", parts),
                            WebSocketRoute("/ws", socket)],
                    middleware=[Middleware(Capture, directory=str(tmp_path))])
    with TestClient(app) as client:
        assert client.post("/echo", json={"text": "x" * 1000}).json() == {"got": 1000}
        huge = client.post("/echo", content=json.dumps({"text": "y" * MAX_BODY}))
        assert huge.json() == {"got": MAX_BODY}  # the app still reads the whole body
        assert client.get("/parts?q=1").text == "data: a\n\ndata: b\n\n"
        with client.websocket_connect("/ws") as ws:
            ws.send_text("hi")
            assert json.loads(ws.receive_text()) == {"echo": "hi"}
    path = tmp_path / f"{os.getpid()}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_exchange_is_one_line_with_both_bodies(tmp_path: Path) -> None:
    small, huge, stream, sent_by_client, sent_by_server = records(tmp_path)
    assert small["method"] == "POST" and small["path"] == "/echo" and small["status"] == 200
    assert json.loads(small["request"]) == {"text": "x" * 1000}
    assert json.loads(small["body"]) == {"got": 1000}
    # a request past MAX_BODY is kept cut; the answer is small and whole
    assert len(huge["request"]) == MAX_BODY and json.loads(huge["body"]) == {"got": MAX_BODY}
    assert stream["query"] == "q=1" and stream["content_type"].startswith("text/event-stream")
    assert stream["body"] == "data: a\n\ndata: b\n\n" and stream["request"] == ""
    assert sent_by_client == {"kind": "websocket", "path": "/ws", "received": True,
                              "body": "hi"}
    assert sent_by_server == {"kind": "websocket", "path": "/ws",
                              "body": json.dumps({"echo": "hi"})}
