"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.errors import APIError, invalid
from api.params import Body, read_json, sampling
from api.state import ServerState, new_id
from api.streaming import (
    DONE,
    ChoiceResult,
    collect,
    error_event,
    sse,
    sse_response,
    unless_disconnected,
    usage,
)
from engine.request import TokenLogprob
from engine.runner import Runner
from parsers.chat_template import ChatTemplate, TemplateError

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
MAX_MESSAGES = 4096


def _content(message: dict[str, Any], where: str) -> str | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise invalid(f"{where}.content[{i}]", "content parts must be objects with a "
                                                       "'type'")
            if part["type"] not in ("text", "input_text", "output_text"):
                raise invalid(f"{where}.content[{i}]",
                              f"content part type '{part['type']}' is not supported by this "
                              "model (text only)")
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{i}].text", "text parts need a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid(f"{where}.content", "'content' must be a string, a list of parts, or null")


def parse_messages(body: Body) -> list[dict[str, Any]]:
    raw = body.data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty list")
    if len(raw) > MAX_MESSAGES:
        raise invalid("messages", f"at most {MAX_MESSAGES} messages are allowed")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, "each message must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role", f"unknown role {role!r}")
        message = {**m, "content": _content(m, where)}
        if message["content"] is None and not m.get("tool_calls"):
            if role != "assistant":
                raise invalid(f"{where}.content", "'content' is required")
            message["content"] = ""
        out.append(message)
    return out


def render_prompt(runner: Runner, template: ChatTemplate, messages: list[dict[str, Any]],
            tools: list[Any] | None, extra: dict[str, Any]) -> list[int]:
    text = template.render(messages, tools=tools, add_generation_prompt=True, **extra)
    tokens = runner.tokenize(text, add_special=False, parse_special=True)
    bos = runner.special_token_text("bos")
    if runner.adds_bos and bos and not text.startswith(bos):
        tokens = [runner.bos_token, *tokens]
    return tokens


def _logprobs_json(runner: Runner, entries: list[TokenLogprob]) -> dict[str, Any]:
    def item(token: int, lp: float) -> dict[str, Any]:
        raw = runner.piece(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    return {"content": [{**item(e.token, e.logprob),
                         "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]}


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    body = Body(await read_json(request, state.max_body_bytes))
    state.require_generative()
    if state.template is None:
        raise APIError("This model has no chat template; set model.chat_template in the config "
                       "or use /v1/completions", code="no_chat_template")
    messages = parse_messages(body)
    n = body.integer("n", 1, 1, state.max_n) or 1
    stream = body.boolean("stream", False)
    want_logprobs = body.boolean("logprobs", False)
    top = body.integer("top_logprobs", None, 0, 20)
    if top is not None and not want_logprobs:
        raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs': true")
    include_usage = bool((body.obj("stream_options") or {}).get("include_usage"))
    tools = body.data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools", "'tools' must be a list")
    if body.data.get("tool_choice") == "none":
        tools = None
    extra = dict(body.obj("chat_template_kwargs") or {})
    if body.has("reasoning_effort"):
        extra.setdefault("reasoning_effort", body.string("reasoning_effort"))
    response_format = body.obj("response_format")
    if response_format and response_format.get("type") not in (None, "text"):
        raise invalid("response_format", "structured output (response_format "
                      f"{response_format.get('type')!r}) is not supported yet")
    params = sampling(body, n_vocab=state.runner.n_vocab,
                      max_tokens_field="max_completion_tokens",
                      logprobs=(top or 0) if want_logprobs else None)
    try:
        prompt = await state.client.run(render_prompt, state.runner, state.template, messages,
                                        tools or None, extra)
    except TemplateError as exc:
        raise APIError(str(exc), param="messages", code="template_error") from None
    gen = state.client.generate([prompt], params, n, param="messages")
    cid, created = new_id("chatcmpl"), int(time.time())
    base = {"id": cid, "object": "chat.completion.chunk", "created": created,
            "model": state.model_name}

    if stream:
        async def chunks() -> AsyncIterator[bytes]:
            results = {r.index: ChoiceResult(r.index) for r in gen.requests}
            extra_usage = {"usage": None} if include_usage else {}
            for r in gen.requests:
                yield sse({**base, "choices": [{"index": r.index, "delta": {
                    "role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}], **extra_usage})
            try:
                async for d in gen.deltas():
                    results[d.index].add(d)
                    if not d.text and d.finish_reason is None and not (
                            want_logprobs and d.logprobs):
                        continue
                    delta = {"content": d.text} if d.text else {}
                    lp = _logprobs_json(state.runner, d.logprobs or []) \
                        if want_logprobs and d.logprobs else None
                    yield sse({**base, "choices": [{"index": d.index, "delta": delta,
                               "logprobs": lp, "finish_reason": d.finish_reason}],
                               **extra_usage})
            except APIError as exc:
                yield error_event(exc)
                return
            if include_usage:
                yield sse({**base, "choices": [], "usage": usage(list(results.values()), n)})
            yield DONE

        return sse_response(gen, chunks())

    results: list[ChoiceResult] = await unless_disconnected(request, gen, collect(gen))
    choices = [{
        "index": res.index,
        "message": {"role": "assistant", "content": res.text},
        "logprobs": _logprobs_json(state.runner, res.logprobs) if want_logprobs else None,
        "finish_reason": res.finish_reason,
    } for res in results]
    return JSONResponse({**base, "object": "chat.completion", "choices": choices,
                         "usage": usage(results, n)})
