"""One generation answered as Ollama answers it, streamed (NDJSON) or whole.

The engine's deltas go through the response parser (reasoning, content, tool calls, as
for every other API) and a ``Shape`` — ``/api/chat``'s ``message`` objects or
``/api/generate``'s ``response`` strings. The last chunk has ``done: true``, the
``done_reason`` (``"stop"``, or ``"length"`` when ``num_predict`` or the context cut it)
and the counts and durations (``api/ollama/timings.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.ollama.ndjson import created_at, line, ndjson_response
from api.ollama.timings import Timings
from api.web.engine_client import Generation
from api.web.errors import APIError, ollama_error
from api.web.gate import note_usage
from api.web.state import ModelState
from api.web.streaming import ChoiceResult, unless_disconnected
from parsers import json_text
from parsers.message_stream import MessageDelta, ToolCall


class Parser(Protocol):
    message: MessageDelta

    def feed(self, text: str) -> MessageDelta: ...

    def finish(self, reason: str | None = None) -> MessageDelta: ...


@dataclass
class PlainText:
    """A raw or fill-in-the-middle prompt's output: the text as the model wrote it."""

    message: MessageDelta = field(default_factory=MessageDelta)

    def feed(self, text: str) -> MessageDelta:
        self.message.content += text
        return MessageDelta(content=text)

    def finish(self, reason: str | None = None) -> MessageDelta:
        return MessageDelta()


def arguments(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object Ollama sends ({} when cut off or not an object)."""
    try:
        value = json_text.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Shape(Protocol):
    model: str

    def piece(self, delta: MessageDelta) -> dict[str, Any] | None: ...

    def beat(self) -> dict[str, Any]: ...

    def final(self, done: dict[str, Any], res: ChoiceResult) -> dict[str, Any]: ...

    def whole(self, message: MessageDelta, done: dict[str, Any],
              res: ChoiceResult) -> dict[str, Any]: ...


@dataclass
class ChatShape:
    """``/api/chat``: ``message`` objects; a tool call is sent whole once it is complete."""

    model: str
    calls: int = 0  # tool calls sent so far (their ``function.index``)

    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at()}

    def _calls(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        out = []
        for call in calls:
            out.append({"id": call.id, "function": {"index": self.calls, "name": call.name,
                                                    "arguments": arguments(call)}})
            self.calls += 1
        return out

    def _message(self, d: MessageDelta) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": d.content}
        if d.reasoning:
            message["thinking"] = d.reasoning
        if d.tool_calls:
            message["tool_calls"] = self._calls(d.tool_calls)
        return message

    def piece(self, delta: MessageDelta) -> dict[str, Any] | None:
        if not (delta.content or delta.reasoning or delta.tool_calls):
            return None
        return {**self._head(), "message": self._message(delta), "done": False}

    def beat(self) -> dict[str, Any]:
        return {**self._head(), "message": {"role": "assistant", "content": ""}, "done": False}

    def final(self, done: dict[str, Any], res: ChoiceResult) -> dict[str, Any]:
        return {**self._head(), "message": {"role": "assistant", "content": ""}, **done}

    def whole(self, message: MessageDelta, done: dict[str, Any],
              res: ChoiceResult) -> dict[str, Any]:
        return {**self._head(), "message": self._message(message), **done}


@dataclass
class GenerateShape:
    """``/api/generate``: ``response`` text (and ``thinking``); the final chunk carries
    ``context`` (the prompt's and the answer's tokens) when ``prompt`` is set."""

    model: str
    prompt: list[int] | None = None  # None: no context returned (raw, FIM, media)

    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at()}

    def _context(self, res: ChoiceResult) -> dict[str, Any]:
        return {} if self.prompt is None else {"context": [*self.prompt, *res.tokens]}

    def piece(self, delta: MessageDelta) -> dict[str, Any] | None:
        if not (delta.content or delta.reasoning):
            return None
        out = {**self._head(), "response": delta.content, "done": False}
        if delta.reasoning:
            out["thinking"] = delta.reasoning
        return out

    def beat(self) -> dict[str, Any]:
        return {**self._head(), "response": "", "done": False}

    def final(self, done: dict[str, Any], res: ChoiceResult) -> dict[str, Any]:
        return {**self._head(), "response": "", **done, **self._context(res)}

    def whole(self, message: MessageDelta, done: dict[str, Any],
              res: ChoiceResult) -> dict[str, Any]:
        out = {**self._head(), "response": message.content}
        if message.reasoning:
            out["thinking"] = message.reasoning
        return {**out, **done, **self._context(res)}


def _done(res: ChoiceResult, timings: Timings) -> dict[str, Any]:
    return {"done": True, "done_reason": "length" if res.finish_reason == "length" else "stop",
            **timings.metrics(res.prompt_tokens, res.completion_tokens)}


async def _gather(gen: Generation, timings: Timings) -> ChoiceResult:
    res = ChoiceResult(0)
    async for d in gen.deltas():
        timings.saw(d)
        res.add(d)
    timings.finish()
    return res


async def respond(request: Request, state: ModelState, gen: Generation, parser: Parser,
                  shape: Shape, *, stream: bool, timings: Timings) -> Response:
    """The generation's answer: NDJSON chunks ending with the ``done`` chunk, or one object."""
    if stream:
        async def chunks() -> AsyncIterator[bytes]:
            res = ChoiceResult(0)
            try:
                async for d in gen.deltas():
                    timings.saw(d)
                    res.add(d)
                    new = parser.feed(d.text) if d.text else MessageDelta()
                    if d.finish_reason is not None:
                        new.extend(parser.finish(d.finish_reason))
                    piece = shape.piece(new)
                    if piece is not None:
                        yield line(piece)
            except APIError as exc:  # the engine failed this request midway
                yield line(ollama_error(exc.message, exc.param))
                return
            timings.finish()
            note_usage(request.scope, state.model_name, res.prompt_tokens,
                       res.completion_tokens)
            yield line(shape.final(_done(res, timings), res))

        return ndjson_response(chunks(), gen=gen,
                               keepalive=state.config.server.keepalive_seconds,
                               beat=line(shape.beat()))

    res = await unless_disconnected(request, gen, _gather(gen, timings))
    parser.feed(res.text)
    parser.finish(res.finish_reason)
    note_usage(request.scope, state.model_name, res.prompt_tokens, res.completion_tokens)
    return JSONResponse(shape.whole(parser.message, _done(res, timings), res))


def loaded(shape: Shape, timings: Timings) -> Response:
    """The answer to a request with nothing to generate: the model is loaded (Ollama's way
    to preload one). A ``keep_alive`` of 0 does not unload it here: models stay loaded
    as the server's config says, so the reason stays ``"load"``."""
    timings.finish()
    metrics = timings.metrics(0, 0)
    done = {"done": True, "done_reason": "load", "total_duration": metrics["total_duration"],
            "load_duration": metrics["load_duration"]}
    return JSONResponse(shape.final(done, ChoiceResult(0)))
