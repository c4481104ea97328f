"""POST/GET/DELETE /v1/responses over HTTP; the run shared with the WebSocket transport."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages, render
from api.chat.prepare import prepare
from api.chat.tools import OutputRules, parse_rules
from api.media.parts import MediaRefs
from api.responses.conversations import add_items, conversation_items
from api.responses.events import Event, ResponseBuilder
from api.responses.items import page, resource_items
from api.responses.request import ResponseRequest, input_messages, parse_request
from api.responses.store import Claim, StoredResponse
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
        self.items = resource_items(req.raw_input)  # this turn's input, as listed
        self.gen: Generation | None = None
        self.saved = False
        self.request: dict[str, Any] | None = None  # a background run's body, to resume it

    async def save(self, final: bool = True) -> None:
        """Store the response (once finished, with ``store``): before its final event is
        sent, so the next turn finds it on any replica sharing the store; then add its
        items to its conversation. A background run also stores its start
        (``final=False``)."""
        if self.saved:
            return
        self.saved = final
        if self.req.store:
            await self.state.responses.put(self.builder.response(), self.conversation,
                                           self.items, self.request)
        if final and self.req.conversation is not None:
            await add_items(self.state.responses, self.req.conversation,
                            [*self.items, *self.builder.output])

    def chat_request(self, media: MediaRefs | None
                     ) -> tuple[Body, OutputRules, list[dict[str, Any]]]:
        """The conversation as the chat route reads it: body, output rules, messages
        (``media`` collects its images and audio)."""
        req = self.req
        messages = ([{"role": "system", "content": req.instructions}] if req.instructions
                    else []) + self.base
        if not messages:
            raise invalid("input", "the conversation is empty")
        messages = parse_messages(Body({"messages": messages}), media)  # as chat renders them
        body = Body({**req.chat_body, "messages": messages})
        return body, parse_rules(body), messages

    async def events(self) -> AsyncGenerator[Event, None]:
        state, req = self.state, self.req
        media = state.media_refs()
        body, rules, messages = self.chat_request(media)
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
                               in_reasoning=prep.in_reasoning, tools=rules.tools,
                               markup_values=prep.markup_values)
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
        # every prompt token not read from the prefix cache is written to it
        usage = {"input_tokens": prompt_tokens, "input_tokens_details": {
                     "cached_tokens": cached, "cache_write_tokens": prompt_tokens - cached},
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
                   local: dict[str, list[dict[str, Any]]] | None = None,
                   conversation: str | None = None) -> list[dict[str, Any]]:
    if conversation is not None:
        return input_messages(await conversation_items(state.responses, conversation),
                              state.seal.open)
    if previous is None:
        return []
    if local is not None and previous in local:
        return local[previous]
    stored = await state.responses.get(previous)
    if stored is None or stored.response.get("object") != "response":
        raise APIError(f"Previous response with id '{previous[:200]}' not found.",
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
    stream = body.boolean("stream", False)
    background = body.boolean("background", False)
    if background and not req.store:
        raise invalid("background", "background responses must be stored: 'store' "
                      "cannot be false with 'background'")
    run = ResponseRun(state, req, await _history(state, req.previous_response_id,
                                                 conversation=req.conversation),
                      None if background else request.scope,
                      noted_session(request.scope), whole=background or not stream)
    if background:
        return await _background(server, run, body.data, stream)
    events = run.events()
    if stream:
        first = await anext(events)  # validation errors become a 4xx before the stream

        async def stream_events() -> AsyncIterator[bytes]:
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

        return BeatingResponse(stream_events(), state.config.server.keepalive_seconds,
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
    async for _ in events:
        pass
    await _store(run)
    return JSONResponse(run.builder.response())


async def _background(server: ServerState, run: ResponseRun, data: dict[str, Any],
                      stream: bool) -> Response:
    """Start a background run; answer with it queued, or stream its events."""
    run.builder.echo["background"] = True
    request = {k: v for k, v in data.items() if k != "stream"}
    if not stream:
        item = await server.background.begin(run, request)
        return JSONResponse(item.run.builder.response())
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    item = await server.background.begin(run, request, listeners=[queue])

    async def events() -> AsyncIterator[bytes]:
        while (event := await queue.get()) is not None:
            yield sse_event(event)

    return BeatingResponse(events(), run.state.config.server.keepalive_seconds,
                           media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def resume_background(server: ServerState, stored: StoredResponse,
                            claim: Claim) -> None:
    """Run again a background response whose server died (``api.responses.background``)."""
    data = stored.request or {}
    response = stored.response
    try:
        state = await server.route(data.get("model"))
        req = parse_request(Body(data), state.seal.open)
        history = await _history(state, req.previous_response_id,
                                 conversation=req.conversation)
    except APIError as exc:
        await server.responses.put({**response, "status": "failed", "error": {
            "code": exc.code or "server_error", "message": exc.message}}, [],
            stored.items, None)
        await server.responses.release(claim)
        return
    run = ResponseRun(state, req, history, whole=True)
    run.builder.response_id = response["id"]
    run.builder.created_at = response.get("created_at", run.builder.created_at)
    run.builder.echo["background"] = True
    await server.background.begin(run, data, claim=claim)


def _not_found(response_id: str) -> APIError:
    return APIError(f"No response found with id '{response_id[:200]}'.", status=404,
                    param="response_id", code="not_found")


async def _stored(server: ServerState, response_id: str) -> StoredResponse:
    stored = await server.responses.get(response_id)
    if stored is None or stored.response.get("object") != "response":
        raise _not_found(response_id)
    return stored


async def get_response(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _stored(server, request.path_params["response_id"])
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    response_id = request.path_params["response_id"]
    await _stored(server, response_id)
    await server.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """``GET /v1/responses/{id}/input_items``: the items of this response's ``input``."""
    server: ServerState = request.app.state.llama
    stored = await _stored(server, request.path_params["response_id"])
    return JSONResponse(page(stored.items, request.query_params))


async def cancel_response(request: Request) -> Response:
    """``POST /v1/responses/{id}/cancel``: stop a background response."""
    server: ServerState = request.app.state.llama
    response_id = request.path_params["response_id"]
    stored = await _stored(server, response_id)
    if not stored.response.get("background"):
        raise APIError("Only background responses can be cancelled.", param="response_id",
                       code="invalid_request")
    cancelled = await server.background.cancel(response_id)
    if cancelled is not None:
        return JSONResponse(cancelled)
    if stored.response.get("status") in ("queued", "in_progress"):
        # its run is on another replica, or died with its server: marked, not resumed
        response = {**stored.response, "status": "cancelled"}
        await server.responses.put(response, stored.conversation, stored.items, None)
        return JSONResponse(response)
    return JSONResponse(stored.response)


async def count_input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: the prompt's length for a response request,
    as it would be rendered (instructions, history, tools), without generating."""
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_chat()
    req = parse_request(body, state.seal.open)
    run = ResponseRun(state, req, await _history(state, req.previous_response_id,
                                                 conversation=req.conversation))
    media = state.media_refs()
    chat, rules, messages = run.chat_request(media)
    extra = {"reasoning_effort": chat.data["reasoning_effort"]} \
        if "reasoning_effort" in chat.data else {}
    _, tokens = await state.client.run(render, state.model, state.template, messages,
                                       rules.tools or None, extra)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})
