"""POST/GET/DELETE /v1/responses over HTTP; the run shared with the WebSocket transport."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages
from api.chat.prepare import prepare
from api.chat.tools import parse_rules
from api.responses.events import Event, ResponseBuilder
from api.responses.request import ResponseRequest, parse_request
from api.web.engine_client import Generation
from api.web.errors import APIError, invalid
from api.web.gate import note_usage
from api.web.params import Body, read_json, sampling
from api.web.session import noted_session, response_id
from api.web.state import ModelState, ServerState
from api.web.streaming import BeatingResponse
from parsers.message_stream import MessageDelta


class ResponseRun:
    """One response: render the conversation, generate, parse, and yield its events.
    After ``events()`` is exhausted, ``builder`` holds the response object and
    ``conversation`` the chat messages through this response's output."""

    def __init__(self, state: ModelState, req: ResponseRequest,
                 history: list[dict[str, Any]],
                 scope: MutableMapping[str, Any] | None = None,
                 session: str | None = None, whole: bool = False) -> None:
        self.state, self.req = state, req
        self.whole = whole  # only the finished response is read (not streamed)
        self.scope: MutableMapping[str, Any] = scope if scope is not None else {}
        self.base = [*history, *req.input_messages]  # what later turns continue from
        seal = state.seal.seal if "reasoning.encrypted_content" in req.include else None
        self.builder = ResponseBuilder(response_id(session), state.model_name,
                                       req.echo, req.offered, seal)
        self.conversation: list[dict[str, Any]] = list(self.base)
        self.gen: Generation | None = None
        self.saved = False

    async def save(self) -> None:
        """Store the response (once, with ``store``): before its final event is sent, so
        the next turn finds it on any replica sharing the store."""
        if self.req.store and not self.saved:
            self.saved = True
            await self.state.responses.put(self.builder.response(), self.conversation)

    async def events(self) -> AsyncGenerator[Event, None]:
        state, req = self.state, self.req
        messages = ([{"role": "system", "content": req.instructions}] if req.instructions
                    else []) + self.base
        if not messages:
            raise invalid("input", "the conversation is empty")
        media = state.media_refs()
        messages = parse_messages(Body({"messages": messages}), media)  # as chat renders them
        body = Body({**req.chat_body, "messages": messages})
        rules = parse_rules(body)
        params = sampling(body, n_vocab=state.model.n_vocab,
                          defaults=state.model_config.sampling)
        extra = {"reasoning_effort": body.data["reasoning_effort"]} \
            if "reasoning_effort" in body.data else {}
        prep = await prepare(state, messages, rules, extra, params, messages_param="input",
                             format_param="text.format", media=media)
        if not req.generate:  # warm the prefix: prefill, one token, nothing reported
            prep = dataclasses.replace(prep, params=dataclasses.replace(
                prep.params, max_tokens=1, grammar=None, grammar_triggers=()))
        gen = self.gen = state.client.generate([prep.prompt], prep.params, 1, param="input",
                                               media=prep.media, adapters=state.adapters(body),
                                               whole=self.whole,
                                               message_ends=prep.message_ends)
        parser = CheckedStream(state.layout, rules, state.model.note_schema_mismatch,
                               in_reasoning=prep.in_reasoning, tools=rules.tools)
        for event in self.builder.start():
            yield event
        prompt_tokens = cached = completion = 0
        finish: str | None = None
        try:
            async for d in gen.deltas():
                if d.error is not None:
                    failed = self.builder.fail(str(d.error))
                    await self.save()
                    for event in failed:
                        yield event
                    return
                prompt_tokens, cached = d.prompt_tokens or prompt_tokens, d.cached_tokens
                completion = d.completion_tokens
                if not req.generate:
                    finish = "stop"
                    continue
                new = parser.feed(d.text) if d.text else MessageDelta()
                if d.finish_reason is not None:
                    finish = d.finish_reason
                    new.extend(parser.finish(d.finish_reason))
                for event in self.builder.add(new):
                    yield event
        finally:
            gen.cancel()  # no-op once finished; frees the sequence if the client left
        message = parser.message
        reasoning_tokens = len(state.model.tokenize(message.reasoning, add_special=False)) \
            if message.reasoning else 0
        usage = {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": completion if req.generate else 0,
                 "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                 "total_tokens": prompt_tokens + (completion if req.generate else 0)}
        if message.content or message.tool_calls:
            turn: dict[str, Any] = {"role": "assistant", "content": message.content or None}
            if message.tool_calls:
                turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.name, "arguments": c.arguments}} for c in message.tool_calls]
            if message.reasoning:
                turn["reasoning_content"] = message.reasoning
            self.conversation.append(turn)
        note_usage(self.scope, state.model_name, prompt_tokens,
                   completion if req.generate else 0)
        final = self.builder.finish(finish, usage)
        await self.save()
        for event in final:
            yield event


async def _history(state: ModelState, previous: str | None,
                   local: dict[str, list[dict[str, Any]]] | None = None
                   ) -> list[dict[str, Any]]:
    if previous is None:
        return []
    if local is not None and previous in local:
        return local[previous]
    stored = await state.responses.get(previous)
    if stored is None:
        raise APIError(f"Previous response with id '{previous}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    return stored.conversation


async def _store(run: ResponseRun) -> None:
    """Store a run that ended without its final events (a failure after they started)."""
    await run.save()


def sse_event(event: Event) -> bytes:
    return (f"event: {event['type']}\ndata: ".encode()
            + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")


async def create_response(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_chat()
    req = parse_request(body, state.seal.open)
    run = ResponseRun(state, req, await _history(state, req.previous_response_id),
                      request.scope, noted_session(request.scope),
                      whole=not body.boolean("stream", False))
    events = run.events()
    if body.boolean("stream", False):
        first = await anext(events)  # validation errors become a 4xx before the stream

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield sse_event(first)
                async for e in events:
                    yield sse_event(e)
            except APIError as exc:
                for event in run.builder.fail(exc.message, exc.code or "server_error"):
                    yield sse_event(event)
            finally:
                await events.aclose()
                if run.gen is not None:
                    run.gen.cancel()
            await _store(run)

        return BeatingResponse(stream(), state.config.server.keepalive_seconds,
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
    async for _ in events:
        pass
    await _store(run)
    return JSONResponse(run.builder.response())


def _not_found(response_id: str) -> APIError:
    return APIError(f"No response found with id '{response_id}'.", status=404,
                    param="response_id", code="not_found")


async def get_response(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    response_id = request.path_params["response_id"]
    stored = await state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    response_id = request.path_params["response_id"]
    if not await state.responses.delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
