"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages, template_kwargs
from api.chat.prepare import prepare
from api.chat.tools import parse_rules
from api.web.errors import APIError, invalid
from api.web.params import Body, read_json, sampling
from api.web.state import ServerState, new_id
from api.web.streaming import (
    DONE,
    ChoiceResult,
    TextEvent,
    collect,
    error_event,
    final_usage,
    sse,
    sse_response,
    timeout_flag,
    unless_disconnected,
)
from engine.handle import ModelHandle
from engine.request import TokenLogprob
from parsers.json_text import custom_input
from parsers.message_stream import MessageDelta, ToolCall


def _logprobs_json(model: ModelHandle, entries: list[TokenLogprob]) -> dict[str, Any]:
    def item(token: int, lp: float) -> dict[str, Any]:
        raw = model.piece(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    return {"content": [{**item(e.token, e.logprob),
                         "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def _call_json(call: ToolCall, custom: frozenset[str]) -> dict[str, Any]:
    if call.name in custom:
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": custom_input(call.arguments)}}
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _finish_reason(reason: str | None, message: MessageDelta) -> str | None:
    return "tool_calls" if reason == "stop" and message.tool_calls else reason


def _reasoning(field: str, text: str) -> dict[str, str]:
    """An answer's reasoning under the field name(s) ``server.reasoning_field`` says."""
    if field == "both":
        return {"reasoning_content": text, "reasoning": text}
    return {field: text}


def _message(m: MessageDelta, field: str, custom: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant",
                           "content": m.content if m.content or not m.tool_calls else None,
                           "refusal": None, "annotations": []}
    if m.reasoning:
        out.update(_reasoning(field, m.reasoning))
    if m.tool_calls:
        out["tool_calls"] = [_call_json(c, custom) for c in m.tool_calls]
    return out


async def create_chat_completion(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_chat()
    media = state.media_refs()
    messages = parse_messages(body, media)
    n = body.integer("n", 1, 1, state.max_n) or 1
    stream = body.boolean("stream", False)
    want_logprobs = body.boolean("logprobs", False)
    top = body.integer("top_logprobs", None, 0, 20)
    if top is not None and not want_logprobs:
        raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs': true")
    include_usage = bool((body.obj("stream_options") or {}).get("include_usage"))
    field = state.config.server.reasoning_field
    rules = parse_rules(body)
    extra = template_kwargs(body)
    params = sampling(body, n_vocab=state.model.n_vocab,
                      defaults=state.model_config.sampling,
                      max_tokens_field="max_completion_tokens",
                      logprobs=(top or 0) if want_logprobs else None)
    prep = await prepare(state, messages, rules, extra, params, messages_param="messages",
                         format_param="response_format", media=media)
    gen = state.client.generate([prep.prompt], prep.params, n, param="messages",
                                media=prep.media, adapters=state.adapters(body),
                                whole=not stream,
                                message_ends=prep.message_ends)
    cid, created = new_id("chatcmpl"), int(time.time())
    base = {"id": cid, "object": "chat.completion.chunk", "created": created,
            "model": state.model_name}

    def parser() -> CheckedStream:
        return CheckedStream(state.layout, rules, state.model.note_schema_mismatch,
                             in_reasoning=prep.in_reasoning, tools=rules.tools,
                             markup_values=prep.markup_values)

    if stream:
        async def chunks() -> AsyncIterator[bytes]:
            results = {r.index: ChoiceResult(r.index) for r in gen.requests}
            parsers = {r.index: parser() for r in gen.requests}
            customs: dict[tuple[int, int], str] = {}  # custom calls' arguments, by choice
            extra_usage = {"usage": None} if include_usage else {}

            def chunk(index: int, delta: dict[str, Any], lp: Any = None,
                      finish: str | None = None, **top: Any) -> bytes:
                return sse({**base, "choices": [{"index": index, "delta": delta, "logprobs": lp,
                                                 "finish_reason": finish}], **top,
                            **extra_usage})

            # the events nearly every token is: its text as content, or as reasoning
            text_events: dict[tuple[int, str], TextEvent] = {}

            def text_chunk(index: int, key: str, text: str) -> bytes:
                event = text_events.get((index, key))
                if event is None:
                    delta = {"content": TextEvent.SLOT} if key == "content" else \
                        _reasoning(field, TextEvent.SLOT)
                    if len(delta) > 1:  # (both reasoning names: the text twice)
                        return chunk(index, _reasoning(field, text))
                    event = text_events[(index, key)] = TextEvent(
                        {**base, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                              "finish_reason": None}], **extra_usage})
                return event(text)

            for r in gen.requests:
                yield chunk(r.index, {"role": "assistant", "content": "", "refusal": None})
            try:
                async for d in gen.deltas():
                    results[d.index].add(d)
                    p = parsers[d.index]
                    new = p.feed(d.text) if d.text else MessageDelta()
                    if d.finish_reason is not None:
                        new.extend(p.finish(d.finish_reason))
                    lp = _logprobs_json(state.model, d.logprobs) \
                        if want_logprobs and d.logprobs else None
                    if new.reasoning:
                        yield text_chunk(d.index, "reasoning", new.reasoning)
                    if new.content and lp is None:
                        yield text_chunk(d.index, "content", new.content)
                    elif new.content or lp is not None:
                        yield chunk(d.index, {"content": new.content} if new.content else {}, lp)
                    for part in new.calls:
                        key = (d.index, part.index)
                        if part.name and part.name in rules.custom:
                            customs[key] = ""  # its input comes whole, at the end
                            yield chunk(d.index, {"tool_calls": [{
                                "index": part.index, "id": part.id, "type": "custom",
                                "custom": {"name": part.name, "input": ""}}]})
                        elif part.name:
                            yield chunk(d.index, {"tool_calls": [{
                                "index": part.index, "id": part.id, "type": "function",
                                "function": {"name": part.name, "arguments": ""}}]})
                        if part.arguments and key in customs:
                            customs[key] += part.arguments
                        elif part.arguments:
                            yield chunk(d.index, {"tool_calls": [{
                                "index": part.index,
                                "function": {"arguments": part.arguments}}]})
                    if d.finish_reason is not None:
                        for (choice, index), arguments in sorted(customs.items()):
                            if choice == d.index:
                                yield chunk(d.index, {"tool_calls": [{
                                    "index": index, "type": "custom",
                                    "custom": {"input": custom_input(arguments)}}]})
                        flag = {"timed_out": True} if d.timed_out else {}
                        yield chunk(d.index, {}, None,
                                    _finish_reason(d.finish_reason, p.message), **flag)
            except APIError as exc:
                yield error_event(exc)
                return
            u = final_usage(request.scope, state.model_name, list(results.values()), n)
            if include_usage:
                yield sse({**base, "choices": [], "usage": u})
            yield DONE

        return sse_response(gen, chunks(), state.config.server.keepalive_seconds)

    results: list[ChoiceResult] = await unless_disconnected(request, gen, collect(gen))
    choices = []
    for res in results:
        p = parser()
        p.feed(res.text)
        p.finish(res.finish_reason)
        choices.append({
            "index": res.index,
            "message": _message(p.message, field, rules.custom),
            "logprobs": _logprobs_json(state.model, res.logprobs) if want_logprobs else None,
            "finish_reason": _finish_reason(res.finish_reason, p.message),
        })
    return JSONResponse({**base, "object": "chat.completion", "choices": choices,
                         **timeout_flag(results),
                         "usage": final_usage(request.scope, state.model_name, results, n)})
