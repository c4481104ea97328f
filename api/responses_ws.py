"""WebSocket /v1/responses: ``response.create`` frames in, the SSE stream's events out.

A connection runs one response at a time. It remembers the conversations of its
last ``server.websocket_history`` responses, so ``previous_response_id`` continues
one with only the new input items (stored or not); the prefix cache keeps the
conversation's KV, so a later turn prefills only what is new. ``generate: false``
warms that prefix without generating. Bad frames get an ``error`` event and the
connection stays open; a client that disconnects cancels its running response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from api.errors import APIError
from api.params import Body
from api.responses import ResponseRun, _history, _store
from api.responses_request import parse_request
from api.state import ServerState

log = logging.getLogger("llamaserve.ws")


def _error(code: str, message: str, *, type: str = "invalid_request_error",
           param: str | None = None, status: int = 400) -> dict[str, Any]:
    return {"type": "error", "status": status,
            "error": {"type": type, "code": code, "message": message, "param": param}}


class Connection:
    def __init__(self, ws: WebSocket, state: ServerState) -> None:
        self.ws, self.state = ws, state
        self.history: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.task: asyncio.Task[None] | None = None

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(event, ensure_ascii=False))

    async def serve(self) -> None:
        await self.ws.accept()
        try:
            while True:
                frame = await self.ws.receive()
                if frame["type"] == "websocket.disconnect":
                    return
                text = frame.get("text")
                if text is None and frame.get("bytes") is not None:
                    text = frame["bytes"].decode("utf-8", "replace")
                await self.handle(text or "")
        except WebSocketDisconnect:
            return
        finally:
            if self.task is not None and not self.task.done():
                self.task.cancel()  # the client left mid-response: stop generating
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.task

    async def handle(self, text: str) -> None:
        try:
            data = json.loads(text)
        except ValueError:
            await self.send(_error("invalid_json", "frames must be JSON objects"))
            return
        if not isinstance(data, dict):
            await self.send(_error("invalid_json", "frames must be JSON objects"))
            return
        kind = data.get("type")
        if kind != "response.create":
            await self.send(_error("unknown_event_type", f"unknown event type {kind!r}; "
                                   "send 'response.create'", param="type"))
            return
        if self.task is not None and not self.task.done():
            await self.send(_error("response_in_progress", "a response is already in "
                                   "progress on this connection; wait for it to finish",
                                   status=409))
            return
        body = {k: v for k, v in data.items() if k not in ("type", "stream", "stream_id")}
        try:
            self.state.require_chat()
            req = parse_request(Body(body), self.state.seal.open)
            history = _history(self.state, req.previous_response_id, self.history)
        except APIError as exc:
            await self.send(_error(exc.code or "invalid_request", exc.message, type=exc.type,
                                   param=exc.param, status=exc.status))
            return
        run = ResponseRun(self.state, req, history)
        self.task = asyncio.create_task(self.run(run))

    async def run(self, run: ResponseRun) -> None:
        events = run.events()
        started = False
        try:
            async for event in events:
                started = True
                await self.send(event)
        except APIError as exc:
            if started:
                for event in run.builder.fail(exc.message, exc.code or "server_error"):
                    await self.send(event)
            else:
                await self.send(_error(exc.code or "invalid_request", exc.message,
                                       type=exc.type, param=exc.param, status=exc.status))
            return
        finally:
            await events.aclose()
            if run.gen is not None:
                run.gen.cancel()
        rid = run.builder.response_id
        self.history[rid] = run.conversation
        while len(self.history) > self.state.config.server.websocket_history:
            self.history.popitem(last=False)
        _store(self.state, run)


async def responses_websocket(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.llama
    await Connection(ws, state).serve()
