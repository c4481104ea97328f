"""Anthropic Messages API: ``POST /v1/messages`` (JSON and SSE) and
``POST /v1/messages/count_tokens``.

A request is translated to chat messages (``api/anthropic/request.py``) and runs the
chat path: the same template rendering, grammars for forced tools, prefix cache,
drafts and response parser. The parsed output becomes content blocks — ``thinking``
(with a ``signature``: the reasoning sealed as for Responses), ``text``, ``tool_use``
— streamed as Anthropic's events: ``message_start``, ``content_block_start`` /
``content_block_delta`` (``thinking_delta``, ``signature_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop``, ``message_delta`` (``stop_reason``,
``stop_sequence``, usage), ``message_stop``, and ``ping`` while nothing else is sent.
``usage.input_tokens`` counts the prompt tokens not read from the cache, and
``cache_read_input_tokens`` those that were, as Anthropic reports them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.anthropic.request import MessagesRequest, parse_messages_request
from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages, render
from api.chat.prepare import prepare
from api.chat.tools import parse_rules
from api.web.errors import APIError, anthropic_error
from api.web.gate import note_usage
from api.web.params import Body, read_json, sampling
from api.web.state import ModelState, ServerState
from api.web.streaming import BeatingResponse, ChoiceResult, collect, unless_disconnected
from parsers import json_text
from parsers.message_stream import MessageDelta, ToolCall

PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def _event(kind: str, **fields: Any) -> bytes:
    return (f"event: {kind}\ndata: ".encode()
            + json.dumps({"type": kind, **fields}, ensure_ascii=False).encode() + b"\n\n")


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json_text.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop_reason(finish: str | None, message: MessageDelta, stop: str | None) -> str:
    if finish == "length":
        return "max_tokens"
    if message.tool_calls:
        return "tool_use"
    return "stop_sequence" if stop is not None else "end_turn"


def _usage(res: ChoiceResult) -> dict[str, Any]:
    return {"input_tokens": res.prompt_tokens - res.cached_tokens,
            "cache_read_input_tokens": res.cached_tokens, "cache_creation_input_tokens": 0,
            "output_tokens": res.completion_tokens}


async def _start(request: Request) -> tuple[ModelState, MessagesRequest, list[dict[str, Any]],
                                            Body]:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_chat()
    req = parse_messages_request(body, count_only=request.url.path.endswith("count_tokens"))
    media = state.media_refs()
    messages = parse_messages(Body({"messages": req.messages}), media)  # as chat renders them
    request.state.media = media
    return state, req, messages, Body({**req.chat_body, "messages": messages})


async def count_tokens(request: Request) -> Response:
    state, req, messages, cbody = await _start(request)
    rules = parse_rules(cbody)
    _, tokens = await state.client.run(render, state.model, state.template, messages,
                                       rules.tools or None, req.extra)
    return JSONResponse({"input_tokens": len(tokens)})


@dataclass
class _Blocks:
    """Content blocks opened and closed as parsed deltas arrive (streaming)."""

    seal: Any
    index: int = -1
    open_kind: str | None = None
    thinking: str = ""
    calls: dict[int, int] = field(default_factory=dict)  # call index -> block index

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open_kind = kind
        return [*out, _event("content_block_start", index=self.index, content_block=block)]

    def close(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        out = []
        if self.open_kind == "thinking":
            out.append(_event("content_block_delta", index=self.index, delta={
                "type": "signature_delta", "signature": self.seal(self.thinking)}))
            self.thinking = ""
        self.open_kind = None
        return [*out, _event("content_block_stop", index=self.index)]

    def add(self, d: MessageDelta) -> list[bytes]:
        out: list[bytes] = []
        if d.reasoning:
            if self.open_kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "",
                                               "signature": ""})
            self.thinking += d.reasoning
            out.append(_event("content_block_delta", index=self.index, delta={
                "type": "thinking_delta", "thinking": d.reasoning}))
        if d.content:
            if self.open_kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(_event("content_block_delta", index=self.index, delta={
                "type": "text_delta", "text": d.content}))
        for part in d.calls:
            if part.name:
                out += self._open("tool_use", {"type": "tool_use", "id": tool_use_id(part.id),
                                               "name": part.name, "input": {}})
            if part.arguments:
                out.append(_event("content_block_delta", index=self.index, delta={
                    "type": "input_json_delta", "partial_json": part.arguments}))
            if part.done:
                out += self.close()
        return out


async def create_message(request: Request) -> Response:
    state, req, messages, cbody = await _start(request)
    rules = parse_rules(cbody)
    params = sampling(cbody, n_vocab=state.model.n_vocab,
                      defaults=state.model_config.sampling)
    prep = await prepare(state, messages, rules, req.extra, params, messages_param="messages",
                         format_param="tools", media=request.state.media)
    gen = state.client.generate([prep.prompt], prep.params, 1, param="messages",
                                media=prep.media, adapters=state.adapters(cbody),
                                clamp=True,  # max_tokens beyond the room left: cut
                                whole=not req.stream,
                                message_ends=prep.message_ends)
    msg_id = "msg_" + secrets.token_hex(12)
    head = {"id": msg_id, "type": "message", "role": "assistant", "model": state.model_name}

    def parser() -> CheckedStream:
        return CheckedStream(state.layout, rules, state.model.note_schema_mismatch,
                             in_reasoning=prep.in_reasoning, tools=rules.tools,
                             markup_values=prep.markup_values)

    if req.stream:
        async def events() -> AsyncIterator[bytes]:
            p, res, stop = parser(), ChoiceResult(0), None
            blocks = _Blocks(state.seal.seal)
            yield _event("message_start", message={
                **head, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(prep.prompt), "output_tokens": 0}})
            try:
                async for d in gen.deltas():
                    res.add(d)
                    stop = d.stop_sequence or stop
                    new = p.feed(d.text) if d.text else MessageDelta()
                    if d.finish_reason is not None:
                        new.extend(p.finish(d.finish_reason))
                    for chunk in blocks.add(new):
                        yield chunk
            except APIError as exc:
                yield _event("error", error=anthropic_error(exc.status, exc.message)["error"])
                return
            finally:
                gen.cancel()
            for chunk in blocks.close():
                yield chunk
            note_usage(request.scope, state.model_name, res.prompt_tokens,
                       res.completion_tokens)
            yield _event("message_delta", delta={
                "stop_reason": _stop_reason(res.finish_reason, p.message, stop),
                "stop_sequence": stop}, usage=_usage(res))
            yield _event("message_stop")

        return BeatingResponse(events(), state.config.server.keepalive_seconds, PING,
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})

    (res,) = await unless_disconnected(request, gen, collect(gen))
    p = parser()
    p.feed(res.text)
    p.finish(res.finish_reason)
    m = p.message
    content: list[dict[str, Any]] = []
    if m.reasoning:
        content.append({"type": "thinking", "thinking": m.reasoning,
                        "signature": state.seal.seal(m.reasoning)})
    if m.content:
        content.append({"type": "text", "text": m.content})
    content += [{"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
                 "input": _input(c)} for c in m.tool_calls]
    note_usage(request.scope, state.model_name, res.prompt_tokens, res.completion_tokens)
    return JSONResponse({**head, "content": content,
                         "stop_reason": _stop_reason(res.finish_reason, m, res.stop_sequence),
                         "stop_sequence": res.stop_sequence, "usage": _usage(res)})
