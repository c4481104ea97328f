"""POST /v1/tokenize, /v1/detokenize and llama-server's /apply-template."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.chat.messages import parse_messages, render_prompt, template_kwargs
from api.chat.prepare import render_turn
from api.chat.tools import parse_rules
from api.web.errors import APIError, invalid
from api.web.params import Body, read_json
from api.web.state import ServerState
from engine.handle import ModelHandle
from parsers.chat_template import TemplateError


def _tokenize(model: ModelHandle, text: str, add_special: bool) -> list[int]:
    return model.tokenize(text, add_special=add_special, parse_special=True)


async def tokenize(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    add_special = body.boolean("add_special", True)
    with_pieces = body.boolean("with_pieces", False)
    if body.has("messages"):
        if state.template is None:
            raise APIError("This model has no chat template", param="messages")
        try:
            tokens = await state.client.run(render_prompt, state.model, state.template,
                                            parse_messages(body), None, {})
        except TemplateError as exc:
            raise APIError(str(exc), param="messages", code="template_error") from None
    else:
        prompt = body.string("prompt")
        if prompt is None:
            raise invalid("prompt", "'prompt' (a string) or 'messages' is required")
        tokens = await state.client.run(_tokenize, state.model, prompt, add_special)
    out: dict[str, object] = {"tokens": tokens, "count": len(tokens),
                              "max_model_len": state.model.n_ctx_seq}
    if with_pieces:
        out["pieces"] = [state.model.piece(t, special=True).decode("utf-8", "replace")
                         for t in tokens]
    return JSONResponse(out)


async def detokenize(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    tokens = body.data.get("tokens")
    n_vocab = state.model.n_vocab
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise invalid("tokens", f"'tokens' must be a list of token ids in [0, {n_vocab})")
    text = await state.client.run(state.model.detokenize, tokens, True)
    return JSONResponse({"prompt": text})


async def apply_template(request: Request) -> Response:
    """llama-server's ``POST /apply-template``: a chat completion's body (messages, tools,
    ``chat_template_kwargs``, ``reasoning_effort``) rendered into the prompt text the
    model would continue, as ``/v1/chat/completions`` renders it, without generating."""
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_chat()
    assert state.template is not None
    messages = parse_messages(body, state.media_refs())
    rules = parse_rules(body)
    extra = template_kwargs(body)
    try:
        text, _, _ = await state.client.run(render_turn, state.model, state.template,
                                            state.layout, messages, rules, extra)
    except TemplateError as exc:
        raise APIError(str(exc), param="messages", code="template_error") from None
    return JSONResponse({"prompt": text})
