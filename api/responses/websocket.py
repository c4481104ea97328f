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

from api.responses.request import parse_request
from api.responses.routes import ResponseRun, _history, _store
from api.web.body import decode_object
from api.web.errors import APIError
from api.web.params import Body
from api.web.session import session_key
from api.web.state import ServerState

log = logging.getLogger("llamaserve.ws")


def _error(code: str, message: str, *, type: str = "invalid_request_error",
           param: str | None = None, status: int = 400) -> dict[str, Any]:
    return {"type": "error", "status": status,
            "error": {"type": type, "code": code, "message": message, "param": param}}


def _internal(exc: Exception) -> dict[str, Any]:
    return _error("internal_error", f"Internal server error: {type(exc).__name__}",
                  type="server_error", status=500)


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
                raw = frame.get("text")
                if raw is None:
                    raw = frame.get("bytes") or b""
                try:
                    await self.handle(raw)
                except (WebSocketDisconnect, asyncio.CancelledError):
                    raise
                except Exception as exc:  # a bug must not close everyone's socket
                    log.exception("websocket frame failed")
                    await self.send(_internal(exc))
        except WebSocketDisconnect:
            return
        finally:
            if self.task is not None and not self.task.done():
                self.task.cancel()  # the client left mid-response: stop generating
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.task

    async def handle(self, raw: str | bytes) -> None:
        try:
            data = decode_object(raw, self.state.body_limits, "A frame")
        except APIError as exc:
            await self.send(_error(exc.code or "invalid_json", exc.message, param=exc.param,
                                   status=exc.status))
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
            state = await self.state.route(body.get("model"))
            state.require_chat()
            req = parse_request(Body(body), state.seal.open)
            history = await _history(state, req.previous_response_id, self.history,
                                     req.conversation)
        except APIError as exc:
            await self.send(_error(exc.code or "invalid_request", exc.message, type=exc.type,
                                   param=exc.param, status=exc.status))
            return
        run = ResponseRun(state, req, history, session=session_key(self.ws.scope, body))
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
        except Exception as exc:
            log.exception("websocket response failed")
            with contextlib.suppress(Exception):
                await self.send(_internal(exc))
            return
        finally:
            await events.aclose()
            if run.gen is not None:
                run.gen.cancel()
        rid = run.builder.response_id
        self.history[rid] = run.conversation
        while len(self.history) > self.state.config.server.websocket_history:
            self.history.popitem(last=False)
        await _store(run)


async def responses_websocket(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.llama
    await Connection(ws, state).serve()
