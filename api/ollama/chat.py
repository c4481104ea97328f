"""``POST /api/chat``: Ollama's chat over the shared chat path.

The messages (``api/ollama/request.py``) are rendered by the model's template, with the
request's ``tools`` and ``format`` turned into the same grammars as chat completions'
``tools`` and ``response_format`` (``api/chat/tools.py``, ``api/chat/prepare.py``); the
output is parsed into content, ``thinking`` and tool calls whose ``arguments`` are objects.
No messages: the model is loaded and nothing is generated (``done_reason: "load"``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages
from api.chat.prepare import prepare
from api.chat.tools import parse_rules
from api.ollama.capabilities import thinks
from api.ollama.options import (
    response_format,
    sampling_params,
    think,
)
from api.ollama.reply import ChatShape, loaded, respond
from api.ollama.request import chat_messages, incoming
from api.web.params import Body


async def chat(request: Request) -> Response:
    call = await incoming(request)
    body, name, timings = call.body, call.name, call.timings
    conversation = chat_messages(body.data.get("messages"))
    state = await call.model()
    state.require_chat()
    if not conversation:
        return loaded(ChatShape(name), timings)
    rules = parse_rules(Body({"tools": body.data.get("tools"),
                              "response_format": response_format(body.data.get("format"))}))
    extra = think(body.data.get("think"), supported=thinks(state), model=name)
    params = sampling_params(body.data.get("options"), n_vocab=state.model.n_vocab,
                             n_ctx=state.model.n_ctx_seq,
                             defaults=state.model_config.sampling)
    media = state.media_refs()
    messages = parse_messages(Body({"messages": conversation}), media)
    prep = await prepare(state, messages, rules, extra, params, messages_param="messages",
                         format_param="format", media=media)
    gen = state.client.generate([prep.prompt], prep.params, 1, param="messages",
                                media=prep.media, whole=not call.stream,
                                adapters=state.adapters(Body({"model": call.resolved.matched})),
                                message_ends=prep.message_ends)
    timings.submit()
    parser = CheckedStream(state.layout, rules, state.model.note_schema_mismatch,
                           in_reasoning=prep.in_reasoning, tools=rules.tools,
                           markup_values=prep.markup_values)
    return await respond(request, state, gen, parser, ChatShape(name), stream=call.stream,
                         timings=timings)
