"""``POST /api/generate``: one prompt, completed.

By default the prompt is one user turn (after ``system``) rendered by the model's chat
template, with ``images``, ``format`` and ``think`` as in ``/api/chat``; the final chunk
returns ``context`` (the prompt's and the answer's tokens), which a later request may send
back to continue from (it is put before the new prompt's tokens). ``raw: true`` (or a
model without a chat template) sends the prompt as it is; ``suffix`` makes a
fill-in-the-middle prompt from the model's FIM tokens (``api/openai/infill.py``). Not
supported: ``template`` (Ollama's Go templates: a 400 — use ``raw``), ``images`` in a raw
or FIM prompt, ``context`` with ``raw`` (as Ollama), ``suffix`` or ``images``.
No prompt: the model is loaded and nothing is generated (``done_reason: "load"``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from api.chat.answer_check import CheckedStream
from api.chat.messages import parse_messages
from api.chat.prepare import Prepared, prepare, prepare_tokens
from api.chat.tools import parse_rules
from api.ollama.capabilities import thinks
from api.ollama.options import (
    response_format,
    sampling_params,
    think,
)
from api.ollama.reply import GenerateShape, Parser, PlainText, loaded, respond
from api.ollama.request import generate_messages, images, incoming
from api.openai.infill import InfillInput, fim_prompt, fim_tokens_or_400
from api.web.errors import invalid
from api.web.params import Body
from api.web.state import ModelState


def _context(raw: Any, n_vocab: int) -> list[int]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in raw):
        raise invalid("context", f"'context' must be a list of token ids in [0, {n_vocab}) "
                      "(as a previous response returned it)")
    return list(raw)


def _text(body: Body, name: str) -> str:
    return body.string(name) or ""


async def generate(request: Request) -> Response:
    call = await incoming(request)
    body, name, timings = call.body, call.name, call.timings
    prompt, suffix, system = _text(body, "prompt"), _text(body, "suffix"), _text(body, "system")
    raw = body.boolean("raw", False)
    if _text(body, "template"):
        raise invalid("template", "'template' (an Ollama Go template) is not supported: "
                      "prompts use the model's chat template; send 'raw': true with a prompt "
                      "formatted as needed")
    if raw and (system or body.data.get("context")):
        raise invalid("raw", "raw mode does not support template, system, or context")
    image_parts = images(body.data.get("images"), "images")
    state = await call.model()
    state.require_generative()
    if not prompt and not suffix and not image_parts:
        return loaded(GenerateShape(name), timings)
    rules = parse_rules(Body({"response_format": response_format(body.data.get("format"))}))
    extra = think(body.data.get("think"), supported=thinks(state), model=name)
    params = sampling_params(body.data.get("options"), n_vocab=state.model.n_vocab,
                             n_ctx=state.model.n_ctx_seq,
                             defaults=state.model_config.sampling)
    context = _context(body.data.get("context"), state.model.n_vocab)
    parser: Parser
    if suffix or raw or state.template is None:
        if image_parts:
            raise invalid("images", "images need the model's chat template: they cannot go "
                          "in a raw or fill-in-the-middle prompt")
        if context and suffix:
            raise invalid("context", "'context' cannot be combined with 'suffix'")
        prep = await prepare_tokens(state, await _plain_prompt(state, prompt, suffix,
                                                               params.max_tokens),
                                    rules, params, format_param="format")
        prep = _after(prep, context, state)
        parser, shape = PlainText(), GenerateShape(name, prep.prompt if context else None)
    else:
        media = state.media_refs()
        messages = parse_messages(Body({"messages": generate_messages(prompt, system,
                                                                      image_parts)}), media)
        prep = await prepare(state, messages, rules, extra, params, messages_param="prompt",
                             format_param="format", media=media)
        if context and prep.media:
            raise invalid("context", "'context' cannot be combined with images")
        prep = _after(prep, context, state)
        parser = CheckedStream(state.layout, rules, state.model.note_schema_mismatch,
                               in_reasoning=prep.in_reasoning)
        shape = GenerateShape(name, None if prep.media else prep.prompt)
    gen = state.client.generate([prep.prompt], prep.params, 1, param="prompt",
                                media=prep.media, whole=not call.stream,
                                adapters=state.adapters(Body({"model": call.resolved.matched})),
                                message_ends=prep.message_ends)
    timings.submit()
    return await respond(request, state, gen, parser, shape, stream=call.stream, timings=timings)


async def _plain_prompt(state: ModelState, prompt: str, suffix: str,
                        max_tokens: int | None) -> list[int]:
    """A raw prompt's tokens (special tokens parsed, BOS as the vocabulary asks), or a
    fill-in-the-middle prompt's."""
    model = state.model
    if suffix:
        fim = fim_tokens_or_400(model, "suffix")
        room = model.n_ctx_seq - (max_tokens or 16)
        return await state.client.run(fim_prompt, model, fim, InfillInput(prompt, suffix), room)
    return await state.client.tokenize(model.tokenize, prompt, True, True, texts=[prompt])


def _after(prep: Prepared, context: list[int], state: ModelState) -> Prepared:
    """The previous exchange's tokens (``context``) before the new prompt, which then
    drops its own BOS."""
    if not context:
        return prep
    tokens = prep.prompt
    if state.model.adds_bos and tokens and tokens[0] == state.model.bos_token:
        tokens = tokens[1:]
    return dataclasses.replace(prep, prompt=[*context, *tokens])
